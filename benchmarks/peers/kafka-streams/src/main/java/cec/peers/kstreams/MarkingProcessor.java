package cec.peers.kstreams;

import java.io.IOException;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * First node after the source: marks the first, the middle and the last input tuple processed, kills this
 * JVM with SIGKILL when it reaches `crashAt` (the crash run), and marks "recovered" when a restarted run
 * reaches `recoverUntil` again (the recovery run). Forwards every tuple unchanged.
 */
final class MarkingProcessor implements FixedKeyProcessor<String, Purchase, Purchase> {
    private final Marks marks;
    private final long last;
    private final long half;
    private final Long crashAt;
    private final Long recoverUntil;
    private FixedKeyProcessorContext<String, Purchase> context;
    private boolean seen;

    MarkingProcessor(Marks marks, long count, Long crashAt, Long recoverUntil) {
        this.marks = marks;
        this.last = count - 1;
        this.half = count / 2;
        this.crashAt = crashAt;
        this.recoverUntil = recoverUntil;
    }

    @Override
    public void init(FixedKeyProcessorContext<String, Purchase> context) {
        this.context = context;
    }

    @Override
    public void process(FixedKeyRecord<String, Purchase> record) {
        long offset = context.recordMetadata().map(m -> m.offset()).orElse(-1L);
        if (!seen) {
            seen = true;
            marks.first("first");
            marks.add("first_offset", offset); // where this run resumed: its last committed offset
        }
        if (crashAt != null && offset >= crashAt) {
            killSelf();
        }
        if (recoverUntil != null && offset >= recoverUntil && !marks.has("recovered")) {
            marks.first("recovered");
            marks.done.countDown();
        }
        context.forward(record);
        if (offset >= half) {
            marks.first("half"); // from here to the last tuple: the JVM's steady rate, its warm-up behind it
        }
        if (offset >= last) {
            marks.first("last");
            marks.done.countDown();
        }
    }

    /** kill -9 of this JVM: no shutdown hook, no flush, no commit, as when the machine kills it. */
    private static void killSelf() {
        String pid = Long.toString(ProcessHandle.current().pid());
        try {
            new ProcessBuilder("kill", "-9", pid).inheritIO().start().waitFor();
            Thread.sleep(60_000); // the signal is on its way; never process another tuple
        } catch (IOException | InterruptedException e) {
            Runtime.getRuntime().halt(137);
        }
        Runtime.getRuntime().halt(137);
    }
}
