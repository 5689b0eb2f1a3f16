package io.qclient.peer;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.producer.DefaultMQProducer;

/**
 * {@code serve}: a long-lived JVM that keeps named producers and runs {@link Bench}
 * measurements on them, so a benchmark can interleave Java and qclient phases on one warmed-up
 * JVM and start several producers' runs together. Commands come on stdin, one per line, words
 * separated by spaces (values hold no spaces):
 *
 * <pre>
 * open NAME --namesrv H:P [--group G] [--latency-fault-enable B] [--send-timeout-ms MS]
 *           [--poll-namesrv-ms MS]
 * run  ID --producer NAME --topic T --mode one-call|threads|async|faults [bench flags]
 * close NAME
 * exit
 * </pre>
 *
 * Every answer is a JSON line with the command's NAME or ID as {@code "id"} and an
 * {@code "event"}: {@code opened} (with the producer's settings), {@code measuring} (with
 * {@code startMs}) then {@code done} (with the run's {@code summary}), {@code closed}, or
 * {@code error} (with {@code error}). Runs go on in threads of their own, so several may be
 * under way at once. A producer gets the client's defaults except the loopback settings every
 * peer client has, an instance of its own (its own connections, routes and fault state), and
 * what the flags set; the name server poll interval is the client's default (30 s), not the
 * 1 s the other peer commands use. Stdin's end (its parent gone) ends the JVM like exit.
 */
final class Serve {
    private static final Set<String> OPEN_FLAGS = Set.of("namesrv", "group", "latency-fault-enable",
            "send-timeout-ms", "poll-namesrv-ms");
    private static final Set<String> RUN_FLAGS = runFlags();

    private final Map<String, DefaultMQProducer> producers = new ConcurrentHashMap<>();
    private final ExecutorService runs = Executors.newCachedThreadPool();

    private Serve() {}

    private static Set<String> runFlags() {
        Set<String> flags = new HashSet<>(Bench.FLAGS);
        flags.removeAll(Set.of("namesrv", "group", "latency-fault-enable"));
        flags.add("producer");
        return Set.copyOf(flags);
    }

    static int run(String[] argv) throws Exception {
        new Args(argv, 1, Set.of(), Set.of()); // no flags of its own
        Serve s = new Serve();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            String line;
            while ((line = in.readLine()) != null) {
                String[] words = line.trim().split("\\s+");
                if (words[0].isEmpty()) {
                    continue;
                }
                if (words[0].equals("exit")) {
                    break;
                }
                String id = words.length > 1 ? words[1] : "";
                try {
                    s.command(words, id);
                } catch (Exception e) {
                    answer(id, "error", "error", Bench.describe(e));
                }
            }
        } finally {
            s.runs.shutdownNow();
            s.runs.awaitTermination(5, TimeUnit.SECONDS);
            s.producers.values().forEach(DefaultMQProducer::shutdown);
        }
        return 0;
    }

    private void command(String[] words, String id) throws Exception {
        switch (words[0]) {
            case "open" -> open(id, new Args(words, 2, OPEN_FLAGS, Set.of()));
            case "run" -> {
                Args a = new Args(words, 2, RUN_FLAGS, Set.of());
                DefaultMQProducer p = producers.get(a.required("producer"));
                if (p == null) {
                    throw new IllegalArgumentException("no producer " + a.required("producer"));
                }
                runs.submit(() -> {
                    try {
                        Map<String, Object> summary =
                                Bench.measure(p, a, ev -> Main.emit(tagged(id, ev)));
                        answer(id, "done", "summary", summary);
                    } catch (Exception e) {
                        answer(id, "error", "error", Bench.describe(e));
                    }
                });
            }
            case "close" -> {
                DefaultMQProducer p = producers.remove(id);
                if (p != null) {
                    p.shutdown();
                }
                answer(id, "closed", null, null);
            }
            default -> throw new IllegalArgumentException("unknown command " + words[0]);
        }
    }

    private void open(String name, Args a) throws Exception {
        if (name.isEmpty() || producers.containsKey(name)) {
            throw new IllegalArgumentException("open needs a new producer name, got '" + name + "'");
        }
        DefaultMQProducer p = new DefaultMQProducer(a.str("group", "qclient-java-peer-" + name));
        Main.configure(p, a.required("namesrv"));
        p.setInstanceName("qclient-peer-" + ProcessHandle.current().pid() + "-" + name);
        p.setPollNameServerInterval(
                a.integer("poll-namesrv-ms", new ClientConfig().getPollNameServerInterval()));
        Boolean lfe = a.bool("latency-fault-enable");
        if (lfe != null) {
            p.setSendLatencyFaultEnable(lfe);
        }
        if (a.has("send-timeout-ms")) {
            p.setSendMsgTimeout(a.integer("send-timeout-ms", 3000));
        }
        p.start();
        producers.put(name, p);
        Map<String, Object> settings = Bench.settings(p);
        settings.put("pollNameServerInterval", p.getPollNameServerInterval());
        answer(name, "opened", "producer", settings);
    }

    private static Map<String, Object> tagged(String id, Map<String, Object> ev) {
        Map<String, Object> o = new LinkedHashMap<>();
        o.put("id", id);
        o.putAll(ev);
        return o;
    }

    private static void answer(String id, String event, String key, Object value) {
        Map<String, Object> o = new LinkedHashMap<>();
        o.put("id", id);
        o.put("event", event);
        if (key != null) {
            o.put(key, value);
        }
        Main.emit(o);
    }
}
