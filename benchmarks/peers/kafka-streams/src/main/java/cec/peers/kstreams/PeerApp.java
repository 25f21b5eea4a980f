package cec.peers.kstreams;

import java.io.IOException;
import java.nio.file.Files;
import java.time.Duration;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.AppInfoParser;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;

/**
 * One run of the Kafka Streams peer (benchmarks/bench_kafka_streams.py starts it): reads the JSON purchases
 * topic, averages the price per item over count windows (a processor over a logged key-value store) or
 * tumbling time windows (the DSL's windowed aggregate, final results only), exactly_once_v2, and writes its
 * marks (Marks) to --result when it has processed the last tuple or, in a recovery run, is back at the crash
 * point. Exit 0 when done, 1 on any error; a crash run ends by SIGKILL of itself.
 */
public final class PeerApp {
    private PeerApp() {}

    public static void main(String[] argv) throws Exception {
        Options options;
        try {
            options = Options.parse(Arrays.asList(argv));
        } catch (IllegalArgumentException e) {
            System.err.println("kstreams-peer: " + e.getMessage());
            System.exit(2);
            return;
        }
        System.exit(run(options));
    }

    static int run(Options o) throws InterruptedException, IOException {
        Marks marks = new Marks();
        Topology topology = o.mode == Options.Mode.COUNT ? countTopology(o, marks) : timeTopology(o, marks);
        KafkaStreams streams = new KafkaStreams(topology, config(o), new MarkingClientSupplier(marks));
        AtomicReference<Throwable> failure = new AtomicReference<>();
        streams.setGlobalStateRestoreListener(new RestoreMarks(marks));
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            marks.done.countDown();
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.PENDING_ERROR) {
                marks.done.countDown();
            }
        });
        marks.first("start");
        streams.start();
        marks.done.await();
        marks.first("stopping");
        streams.close(Duration.ofSeconds(60));
        marks.first("closed");
        Map<String, String> extra = new LinkedHashMap<>();
        extra.put("kafka_streams_version", AppInfoParser.getVersion());
        extra.put("mode", o.mode.name().toLowerCase());
        if (failure.get() != null) {
            extra.put("error", String.valueOf(failure.get()));
        }
        Files.writeString(o.result, marks.toJson(extra));
        if (failure.get() != null) {
            System.err.println("kstreams-peer: " + failure.get());
            return 1;
        }
        return 0;
    }

    static Properties config(Options o) {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, o.applicationId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, o.bootstrap);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.STATE_DIR_CONFIG, o.stateDir.toString());
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // A SIGKILLed member stays in the group until its session times out, and the restarted instance waits
        // for that before it gets the partition: the same 6 s the Quix runner uses (the broker's minimum).
        p.put(StreamsConfig.mainConsumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
        p.put(StreamsConfig.mainConsumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 500);
        if (o.transactionTimeoutMs != null) {
            p.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), o.transactionTimeoutMs);
        }
        p.putAll(o.streamsConfig);
        return p;
    }

    /** Count windows: the marking node, then the CountWindowAverage processor and its logged store. */
    static Topology countTopology(Options o, Marks marks) {
        StreamsBuilder builder = new StreamsBuilder();
        StoreBuilder<KeyValueStore<String, CountSum>> store = Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore(CountWindowAverage.STORE), Serdes.String(), CountSum.serde());
        builder.addStateStore(o.caching ? store.withCachingEnabled() : store.withCachingDisabled());
        marked(builder.stream(o.input, Consumed.with(Serdes.String(), Purchase.serde())), o, marks)
                .process(() -> new CountWindowAverage(o.window), Named.as("count-average"), CountWindowAverage.STORE)
                .to(o.output, Produced.with(Serdes.String(), Serdes.Double()));
        return builder.build();
    }

    /**
     * Tumbling time windows of --window-ms on the purchase's item_time (+ --time-base-ms, so that event times
     * are recent and no topic's retention deletes them), no grace, final results only (emitted when stream
     * time passes the window's end): the DSL's windowed aggregate over a logged window store.
     */
    static Topology timeTopology(Options o, Marks marks) {
        StreamsBuilder builder = new StreamsBuilder();
        long base = o.timeBaseMs;
        Consumed<String, Purchase> consumed = Consumed.with(Serdes.String(), Purchase.serde())
                .withTimestampExtractor((record, partitionTime) -> record.value() instanceof Purchase p
                        ? base + p.itemTime
                        : partitionTime);
        Materialized<String, CountSum, WindowStore<Bytes, byte[]>> store =
                Materialized.<String, CountSum, WindowStore<Bytes, byte[]>>as("time-count-sum")
                        .withKeySerde(Serdes.String())
                        .withValueSerde(CountSum.serde());
        marked(builder.stream(o.input, consumed), o, marks)
                .filter((key, p) -> p != null && p.itemPrice != null, Named.as("priced"))
                .groupByKey()
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(o.windowMs), Duration.ZERO))
                .emitStrategy(EmitStrategy.onWindowClose())
                .aggregate(
                        () -> CountSum.EMPTY,
                        (key, p, open) -> open.add(p.itemPrice),
                        Named.as("time-average"),
                        o.caching ? store.withCachingEnabled() : store.withCachingDisabled())
                .toStream(Named.as("closed"))
                .mapValues(CountSum::average, Named.as("average"))
                .to(o.output, Produced.with(
                        WindowedSerdes.timeWindowedSerdeFrom(String.class, o.windowMs), Serdes.Double()));
        return builder.build();
    }

    private static KStream<String, Purchase> marked(KStream<String, Purchase> source, Options o, Marks marks) {
        return source.processValues(
                () -> new MarkingProcessor(marks, o.count, o.crashAt, o.recoverUntil), Named.as("marks"));
    }

    /** The changelog restore's start and end, and how many records it read back. */
    private static final class RestoreMarks implements StateRestoreListener {
        private final Marks marks;

        RestoreMarks(Marks marks) {
            this.marks = marks;
        }

        @Override
        public void onRestoreStart(TopicPartition partition, String store, long startOffset, long endOffset) {
            marks.first("restore_start");
            marks.add("restore_end_offset", endOffset);
        }

        @Override
        public void onBatchRestored(TopicPartition partition, String store, long batchEndOffset, long restored) {
            marks.add("restored_records", restored);
        }

        @Override
        public void onRestoreEnd(TopicPartition partition, String store, long totalRestored) {
            marks.last("restore_end");
        }
    }
}
