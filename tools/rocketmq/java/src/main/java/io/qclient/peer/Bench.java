package io.qclient.peer;

import com.alibaba.fastjson2.JSON;
import com.alibaba.fastjson2.JSONWriter;
import com.sun.management.OperatingSystemMXBean;
import java.io.BufferedWriter;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Consumer;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.remoting.exception.RemotingConnectException;
import org.apache.rocketmq.remoting.exception.RemotingTimeoutException;

/**
 * {@code bench}: the Java producer, with its defaults except what the flags set, as the peer
 * qclient's producer is measured against. Modes: {@code one-call} (one thread, synchronous
 * sends), {@code threads} (--threads threads sharing one producer, synchronous),
 * {@code async} (send with a callback, at most --inflight outstanding) and {@code faults}
 * (like threads, for --duration-s, every send recorded). Every run is bounded by --count and,
 * when given, --duration-s; --rate paces the sends of all threads together (0: as fast as
 * they go). Warm-up sends (--warmup, to --warmup-topic) come first; the measured phase starts
 * after them, at --start-at-ms when given (so several producers can start together). Prints
 * one summary line; with --out (always in faults mode) writes a timeline of every send as JSON
 * lines {"startMs","endMs","ok","key","uniqKey","broker","thread","error"} (epoch ms,
 * fractional), ordered by start. {@link Serve} runs the same measurement on producers it keeps.
 */
final class Bench {
    static final Set<String> FLAGS = Set.of("namesrv", "topic", "mode", "count", "threads",
            "body-size", "delay-ms", "latency-fault-enable", "duration-s", "out", "group",
            "warmup", "rate", "inflight", "key-prefix", "warmup-topic", "start-at-ms");

    /** One measured send. */
    private record Rec(long startNs, long endNs, boolean ok, String key, String uniqKey,
                       String broker, int thread, String error) {}

    private final DefaultMQProducer producer;
    private final String topic;
    private final byte[] body;
    private final long delayMs;
    private final String keyPrefix;
    private final long count;
    private final long durationNs;
    private long deadlineNs;
    private final double nsPerSend;
    private final boolean timeline;
    private final AtomicLong tickets = new AtomicLong();
    private final Map<String, AtomicLong> errorKinds = new TreeMap<>();
    private final List<Rec> recs = new ArrayList<>();
    private long startNs;

    private Bench(DefaultMQProducer producer, Args a, String mode) {
        this.producer = producer;
        this.topic = a.required("topic");
        this.body = new byte[a.integer("body-size", 100)];
        for (int i = 0; i < body.length; i++) {
            body[i] = (byte) ('a' + i % 26);
        }
        this.delayMs = a.num("delay-ms", 0);
        boolean faults = mode.equals("faults");
        this.timeline = faults || a.has("out");
        if (faults && !a.has("out")) {
            throw new IllegalArgumentException("--mode faults needs --out FILE");
        }
        this.keyPrefix = a.str("key-prefix", faults ? "f" + ProcessHandle.current().pid() + "-" : null);
        this.count = a.num("count", faults ? 10_000_000 : 2_000);
        long durationS = a.num("duration-s", faults ? -1 : 0);
        if (durationS < 0) {
            throw new IllegalArgumentException("--mode faults needs --duration-s");
        }
        this.durationNs = TimeUnit.SECONDS.toNanos(durationS);
        long rate = a.num("rate", 0);
        this.nsPerSend = rate > 0 ? 1e9 / rate : 0;
    }

    static int run(String[] argv) throws Exception {
        Args a = new Args(argv, 1, FLAGS, Set.of());
        DefaultMQProducer producer = new DefaultMQProducer(a.str("group", "qclient-java-peer-bench"));
        Main.configure(producer, a.required("namesrv"));
        Boolean lfe = a.bool("latency-fault-enable");
        if (lfe != null) {
            producer.setSendLatencyFaultEnable(lfe);
        }
        Map<String, Object> summary;
        producer.start();
        try {
            summary = measure(producer, a, ev -> { });
        } finally {
            producer.shutdown();
        }
        Main.emit(summary);
        return 0;
    }

    /**
     * One run on a started producer: warm-up sends (to --warmup-topic, default --topic), then
     * at --start-at-ms (epoch ms; at once when absent or past) the measured phase, announced
     * to {@code events} as {@code {"event":"measuring","startMs":...}}; returns the summary
     * (and writes the timeline to --out when given).
     */
    static Map<String, Object> measure(DefaultMQProducer producer, Args a,
                                       Consumer<Map<String, Object>> events) throws Exception {
        String mode = a.required("mode");
        if (!Set.of("one-call", "threads", "async", "faults").contains(mode)) {
            throw new IllegalArgumentException("--mode one-call|threads|async|faults, got " + mode);
        }
        Bench b = new Bench(producer, a, mode);
        int threads = mode.equals("one-call") ? 1 : a.integer("threads", 64);
        Map<String, Object> summary = new LinkedHashMap<>();
        int warmup = a.integer("warmup", 100);
        int warmupErrors = 0;
        String warmupTopic = a.str("warmup-topic", b.topic);
        long warmupStartNs = System.nanoTime();
        for (int i = 0; i < warmup; i++) {
            try {
                producer.send(b.message(warmupTopic, null));
            } catch (Exception e) {
                warmupErrors++;
            }
        }
        long warmupNs = System.nanoTime() - warmupStartNs;
        long startAtMs = a.num("start-at-ms", 0);
        long waitMs;
        while ((waitMs = startAtMs - System.currentTimeMillis()) > 0) {
            Thread.sleep(Math.min(waitMs, 100));
        }
        // The measured phase: --duration-s counts from here, after start-up and warm-up.
        long cpu0 = cpuNs();
        b.startNs = System.nanoTime();
        b.deadlineNs = b.durationNs == 0 ? Long.MAX_VALUE : b.startNs + b.durationNs;
        Map<String, Object> ev = new LinkedHashMap<>();
        ev.put("event", "measuring");
        ev.put("startMs", System.currentTimeMillis());
        events.accept(ev);
        if (mode.equals("async")) {
            b.runAsync(a.integer("inflight", 1024));
        } else {
            b.runThreads(threads);
        }
        long cpuNs = cpuNs() - cpu0;
        summary.put("mode", mode);
        summary.put("threads", mode.equals("async") ? null : threads);
        summary.put("inflight", mode.equals("async") ? a.integer("inflight", 1024) : null);
        summary.put("warmup", warmup);
        summary.put("warmup_errors", warmupErrors);
        summary.put("warmup_s", round(warmupNs / 1e9));
        summary.put("body_size", b.body.length);
        summary.put("delay_ms", b.delayMs);
        summary.put("rate", a.num("rate", 0));
        b.summarize(summary);
        // the whole JVM's CPU (every thread: the client's, GC, JIT) per acknowledged send
        Object ok = summary.get("ok");
        summary.put("client_cpu_us_per_msg",
                ok instanceof Integer n && n > 0 && cpuNs >= 0 ? round(cpuNs / 1e3 / n) : null);
        summary.put("producer", settings(producer));
        if (b.timeline) {
            String out = a.required("out");
            b.writeTimeline(Path.of(out));
            summary.put("out", out);
        }
        return summary;
    }

    /** This JVM's CPU time so far (ns, every thread), or -1 where the JVM does not tell. */
    private static long cpuNs() {
        if (ManagementFactory.getOperatingSystemMXBean() instanceof OperatingSystemMXBean os) {
            return os.getProcessCpuTime();
        }
        return -1;
    }

    private Message message(String key) {
        return message(topic, key);
    }

    private Message message(String toTopic, String key) {
        Message m = new Message(toTopic, null, key, body);
        if (delayMs > 0) {
            m.setDeliverTimeMs(System.currentTimeMillis() + delayMs);
        }
        return m;
    }

    /** The next ticket inside the count and time bounds, paced by --rate; -1 when done. */
    private long nextTicket() {
        long t = tickets.getAndIncrement();
        if (t >= count || System.nanoTime() >= deadlineNs) {
            return -1;
        }
        if (nsPerSend > 0) {
            long due = startNs + (long) (t * nsPerSend);
            long wait;
            while ((wait = due - System.nanoTime()) > 0) {
                LockSupport.parkNanos(wait);
            }
            if (System.nanoTime() >= deadlineNs) {
                return -1;
            }
        }
        return t;
    }

    private void runThreads(int threads) throws InterruptedException {
        List<Thread> workers = new ArrayList<>();
        List<List<Rec>> perThread = new ArrayList<>();
        for (int i = 0; i < threads; i++) {
            List<Rec> mine = new ArrayList<>();
            perThread.add(mine);
            int id = i;
            Thread th = new Thread(() -> {
                long t;
                while ((t = nextTicket()) >= 0) {
                    String key = keyPrefix == null ? null : keyPrefix + t;
                    long s = System.nanoTime();
                    try {
                        SendResult r = producer.send(message(key));
                        mine.add(new Rec(s, System.nanoTime(), true, key,
                                timeline ? r.getMsgId() : null, broker(r), id, null));
                    } catch (Exception e) {
                        mine.add(new Rec(s, System.nanoTime(), false, key, null, null, id, describe(e)));
                        countError(e);
                    }
                }
            }, "bench-" + i);
            workers.add(th);
            th.start();
        }
        for (Thread th : workers) {
            th.join();
        }
        perThread.forEach(recs::addAll);
    }

    private void runAsync(int inflight) throws InterruptedException {
        Semaphore slots = new Semaphore(inflight);
        long t;
        while ((t = nextTicket()) >= 0) {
            String key = keyPrefix == null ? null : keyPrefix + t;
            slots.acquire();
            long s = System.nanoTime();
            try {
                producer.send(message(key), new SendCallback() {
                    @Override
                    public void onSuccess(SendResult r) {
                        record(new Rec(s, System.nanoTime(), true, key, timeline ? r.getMsgId() : null,
                                broker(r), 0, null));
                        slots.release();
                    }

                    @Override
                    public void onException(Throwable e) {
                        record(new Rec(s, System.nanoTime(), false, key, null, null, 0, describe(e)));
                        countError(e);
                        slots.release();
                    }
                });
            } catch (Exception e) {
                record(new Rec(s, System.nanoTime(), false, key, null, null, 0, describe(e)));
                countError(e);
                slots.release();
            }
        }
        // Every callback comes within the send timeout; wait a bounded while for the last ones.
        if (!slots.tryAcquire(inflight, producer.getSendMsgTimeout() + 30_000L, TimeUnit.MILLISECONDS)) {
            synchronized (errorKinds) {
                errorKinds.computeIfAbsent("callback-missing", k -> new AtomicLong())
                        .addAndGet(inflight - slots.availablePermits());
            }
        }
    }

    private static String broker(SendResult r) {
        return r.getMessageQueue() == null ? null : r.getMessageQueue().getBrokerName();
    }

    private void record(Rec r) {
        synchronized (recs) {
            recs.add(r);
        }
    }

    private void countError(Throwable e) {
        String kind = kind(e);
        synchronized (errorKinds) {
            errorKinds.computeIfAbsent(kind, k -> new AtomicLong()).incrementAndGet();
        }
    }

    private void summarize(Map<String, Object> o) {
        List<Rec> all;
        synchronized (recs) {
            all = new ArrayList<>(recs);
        }
        long[] lat = all.stream().filter(Rec::ok).mapToLong(r -> r.endNs - r.startNs).sorted().toArray();
        long end = all.stream().mapToLong(Rec::endNs).max().orElse(startNs);
        double elapsedS = (end - startNs) / 1e9;
        o.put("count", all.size());
        o.put("ok", lat.length);
        o.put("errors", all.size() - lat.length);
        o.put("elapsed_s", round(elapsedS));
        o.put("msgs_per_s", elapsedS > 0 ? round(lat.length / elapsedS) : null);
        o.put("p50_ms", pct(lat, 0.50));
        o.put("p90_ms", pct(lat, 0.90));
        o.put("p99_ms", pct(lat, 0.99));
        o.put("p999_ms", pct(lat, 0.999));
        o.put("max_ms", lat.length == 0 ? null : round(lat[lat.length - 1] / 1e6));
        o.put("mean_ms", lat.length == 0 ? null : round(Arrays.stream(lat).average().orElse(0) / 1e6));
        Map<String, Long> kinds = new TreeMap<>();
        synchronized (errorKinds) {
            errorKinds.forEach((k, v) -> kinds.put(k, v.get()));
        }
        o.put("error_kinds", kinds);
    }

    private void writeTimeline(Path out) throws IOException {
        long baseNs = System.nanoTime();
        double baseMs = System.currentTimeMillis();
        List<Rec> all = new ArrayList<>(recs);
        all.sort(Comparator.comparingLong(Rec::startNs));
        try (BufferedWriter w = Files.newBufferedWriter(out, StandardCharsets.UTF_8)) {
            for (Rec r : all) {
                Map<String, Object> o = new LinkedHashMap<>();
                o.put("startMs", round(baseMs + (r.startNs - baseNs) / 1e6));
                o.put("endMs", round(baseMs + (r.endNs - baseNs) / 1e6));
                o.put("ok", r.ok);
                o.put("key", r.key);
                o.put("uniqKey", r.uniqKey);
                o.put("broker", r.broker);
                o.put("thread", r.thread);
                o.put("error", r.error);
                w.write(JSON.toJSONString(o, JSONWriter.Feature.WriteNulls));
                w.newLine();
            }
        }
    }

    static Map<String, Object> settings(DefaultMQProducer p) {
        Map<String, Object> o = new LinkedHashMap<>();
        o.put("sendMsgTimeout", p.getSendMsgTimeout());
        o.put("retryTimesWhenSendFailed", p.getRetryTimesWhenSendFailed());
        o.put("retryTimesWhenSendAsyncFailed", p.getRetryTimesWhenSendAsyncFailed());
        o.put("retryAnotherBrokerWhenNotStoreOK", p.isRetryAnotherBrokerWhenNotStoreOK());
        o.put("sendLatencyFaultEnable", p.isSendLatencyFaultEnable());
        o.put("vipChannelEnabled", p.isVipChannelEnabled());
        o.put("compressMsgBodyOverHowmuch", p.getCompressMsgBodyOverHowmuch());
        o.put("enableBackpressureForAsyncMode", p.isEnableBackpressureForAsyncMode());
        o.put("namesrvAddr", p.getNamesrvAddr());
        return o;
    }

    private static Double pct(long[] sorted, double q) {
        if (sorted.length == 0) {
            return null;
        }
        int i = (int) Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1);
        return round(sorted[Math.max(0, i)] / 1e6);
    }

    private static double round(double v) {
        return Math.round(v * 1000.0) / 1000.0;
    }

    /** A short error kind to count by: broker:CODE, client:CODE, timeout, connect, or a class. */
    static String kind(Throwable e) {
        if (e instanceof MQBrokerException b) {
            return "broker:" + b.getResponseCode();
        }
        if (e instanceof MQClientException c) {
            if (c.getCause() != null) {
                return "client/" + kind(c.getCause());
            }
            return "client:" + c.getResponseCode();
        }
        if (e instanceof RemotingTimeoutException) {
            return "timeout";
        }
        if (e instanceof RemotingConnectException) {
            return "connect";
        }
        return e.getClass().getSimpleName();
    }

    /** The error kind and its first message line, at most 300 characters. */
    static String describe(Throwable e) {
        String msg = e instanceof MQClientException c && c.getErrorMessage() != null
                ? c.getErrorMessage() : String.valueOf(e.getMessage());
        int nl = msg.indexOf('\n');
        String s = kind(e) + ": " + (nl >= 0 ? msg.substring(0, nl) : msg);
        return s.length() > 300 ? s.substring(0, 300) : s;
    }
}
