package cec.peers.kstreams;

import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The paper's aggregate: the average price per key over count windows of `window` tuples. The store (logged
 * to its changelog topic) holds the open window's count and sum per key; the window's last tuple emits the
 * average and deletes the key, so a closed window keeps no state (the changelog gets a tombstone).
 */
final class CountWindowAverage implements Processor<String, Purchase, String, Double> {
    static final String STORE = "count-sum";

    private final int window;
    private ProcessorContext<String, Double> context;
    private KeyValueStore<String, CountSum> store;

    CountWindowAverage(int window) {
        this.window = window;
    }

    @Override
    public void init(ProcessorContext<String, Double> context) {
        this.context = context;
        this.store = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<String, Purchase> record) {
        Purchase p = record.value();
        if (p == null || p.itemPrice == null) {
            return; // no price: nothing to average (the benchmark's input has none of these)
        }
        CountSum open = store.get(record.key());
        CountSum now = (open == null ? CountSum.EMPTY : open).add(p.itemPrice);
        if (now.count >= window) {
            store.delete(record.key());
            context.forward(record.withValue(now.average()));
        } else {
            store.put(record.key(), now);
        }
    }
}
