package cec.peers.kstreams;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;

/**
 * Moments of one run, in seconds since the JVM's main() started (the same marks the Quix runner of
 * bench_quix.py keeps): the partition's assignment, the changelog restore, the first and last input tuple
 * processed, and the tuple at which a recovery run is caught up with the crash point. `done` is released
 * when the run has seen what it waits for.
 */
final class Marks {
    private final long startedNanos = System.nanoTime();
    private final Map<String, Double> seconds = new ConcurrentHashMap<>();
    private final Map<String, Long> counts = new ConcurrentHashMap<>();
    final CountDownLatch done = new CountDownLatch(1);

    double now() {
        return (System.nanoTime() - startedNanos) / 1e9;
    }

    /** Keeps the first time a mark is set (a rebalance may assign the partition more than once). */
    void first(String name) {
        seconds.putIfAbsent(name, now());
    }

    /** Keeps the latest time a mark is set. */
    void last(String name) {
        seconds.put(name, now());
    }

    void add(String name, long n) {
        counts.merge(name, n, Long::sum);
    }

    boolean has(String name) {
        return seconds.containsKey(name);
    }

    /** The marks as one flat JSON object (numbers only, so no JSON library is needed to write it). */
    String toJson(Map<String, String> extra) {
        StringBuilder out = new StringBuilder("{");
        Map<String, Object> all = new TreeMap<>();
        all.putAll(seconds);
        counts.forEach((k, v) -> all.put(k, v));
        for (Map.Entry<String, Object> e : all.entrySet()) {
            out.append(out.length() > 1 ? ", " : "").append('"').append(e.getKey()).append("\": ").append(e.getValue());
        }
        for (Map.Entry<String, String> e : extra.entrySet()) {
            out.append(out.length() > 1 ? ", " : "").append('"').append(e.getKey()).append("\": \"")
                    .append(e.getValue().replace("\\", "\\\\").replace("\"", "\\\"")).append('"');
        }
        return out.append("}").toString();
    }
}
