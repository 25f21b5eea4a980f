package cec.peers.kstreams;

import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/** The command line of one run of the peer, parsed into typed fields (every flag is `--name value`). */
final class Options {
    /** Which aggregate runs: the count window processor or the DSL's tumbling time window. */
    enum Mode { COUNT, TIME }

    private static final Set<String> REQUIRED =
            Set.of("bootstrap", "input", "output", "application-id", "state-dir", "count", "result", "mode");
    private static final Set<String> OPTIONAL = Set.of(
            "window", "window-ms", "time-base-ms", "crash-at", "recover-until", "caching", "transaction-timeout-ms", "streams-config");

    final String bootstrap;
    final String input;
    final String output;
    final String applicationId;
    final Path stateDir;
    final long count;
    final Path result;
    final Mode mode;
    final int window;
    final long windowMs;
    final long timeBaseMs;
    final Long crashAt;
    final Long recoverUntil;
    final boolean caching;
    final Integer transactionTimeoutMs;
    /** More Kafka Streams settings, `name=value` separated by commas (e.g. commit.interval.ms=1000). */
    final Map<String, String> streamsConfig = new HashMap<>();

    private Options(Map<String, String> v) {
        bootstrap = v.get("bootstrap");
        input = v.get("input");
        output = v.get("output");
        applicationId = v.get("application-id");
        stateDir = Path.of(v.get("state-dir"));
        count = Long.parseLong(v.get("count"));
        result = Path.of(v.get("result"));
        mode = Mode.valueOf(v.get("mode").toUpperCase());
        window = Integer.parseInt(v.getOrDefault("window", "10"));
        windowMs = Long.parseLong(v.getOrDefault("window-ms", "10000"));
        timeBaseMs = Long.parseLong(v.getOrDefault("time-base-ms", "0"));
        crashAt = v.containsKey("crash-at") ? Long.valueOf(v.get("crash-at")) : null;
        recoverUntil = v.containsKey("recover-until") ? Long.valueOf(v.get("recover-until")) : null;
        caching = Boolean.parseBoolean(v.getOrDefault("caching", "true"));
        transactionTimeoutMs =
                v.containsKey("transaction-timeout-ms") ? Integer.valueOf(v.get("transaction-timeout-ms")) : null;
        for (String pair : v.getOrDefault("streams-config", "").split(",")) {
            if (pair.isBlank()) {
                continue;
            }
            int eq = pair.indexOf('=');
            if (eq < 1) {
                throw new IllegalArgumentException("--streams-config wants name=value pairs, got " + pair);
            }
            streamsConfig.put(pair.substring(0, eq).trim(), pair.substring(eq + 1).trim());
        }
        if (count < 1 || window < 1 || windowMs < 1) {
            throw new IllegalArgumentException("--count, --window and --window-ms must be positive");
        }
    }

    static Options parse(List<String> args) {
        Map<String, String> values = new HashMap<>();
        for (int i = 0; i < args.size(); i += 2) {
            String flag = args.get(i);
            if (!flag.startsWith("--") || i + 1 >= args.size()) {
                throw new IllegalArgumentException("expected --name value pairs, got " + flag);
            }
            String name = flag.substring(2);
            if (!REQUIRED.contains(name) && !OPTIONAL.contains(name)) {
                throw new IllegalArgumentException("unknown option " + flag);
            }
            values.put(name, args.get(i + 1));
        }
        for (String name : REQUIRED) {
            if (!values.containsKey(name)) {
                throw new IllegalArgumentException("missing --" + name);
            }
        }
        return new Options(values);
    }
}
