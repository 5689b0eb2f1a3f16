package io.qclient.peer;

import com.alibaba.fastjson2.JSON;
import com.alibaba.fastjson2.JSONWriter;
import java.io.FileOutputStream;
import java.io.FileDescriptor;
import java.io.PrintStream;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.rocketmq.client.ClientConfig;

/**
 * Apache RocketMQ's Java client as a peer for qclient's Python tests and benchmarks.
 *
 * <pre>
 * consume --namesrv H:P --topic T --group G --count N --timeout-ms MS [--tags EXPR]
 *         [--settle-ms MS] [--stop-file PATH]
 * produce --namesrv H:P --topic T --count N [--delay-ms D] [--deliver-at-ms A] [--tags T]
 *         [--keys K] [--prop k=v ...] [--body TEXT] [--group G]
 * bench   --namesrv H:P --topic T --mode one-call|threads|async|faults --count N ...
 * serve   (commands on stdin: open / run / close named producers; see Serve)
 * </pre>
 *
 * Results are JSON lines on stdout; the client's own logging goes to stderr. Exit status 0
 * on success, 1 when a send failed (produce), 2 on bad flags.
 */
public final class Main {
    /** The JSON-lines channel: the real stdout, so stray prints of the client cannot mix in. */
    private static final PrintStream OUT =
            new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);

    private Main() {}

    public static void main(String[] argv) throws Exception {
        // Everything else that prints to System.out goes to stderr.
        System.setOut(System.err);
        // The shaded logback picks the first rmq.*.logback.xml on the classpath (the broker's
        // with lib/*), which logs to files under user.home; this one logs to stderr only.
        if (System.getProperty("rmq.logback.configurationFile") == null) {
            System.setProperty("rmq.logback.configurationFile", "qclient-peer.logback.xml");
        }
        // Rebalance and route refresh wait 20 s / 30 s by default; a test tool wants seconds.
        if (System.getProperty("rocketmq.client.rebalance.waitInterval") == null) {
            System.setProperty("rocketmq.client.rebalance.waitInterval", "1000");
        }
        if (argv.length == 0) {
            System.err.println("usage: Main consume|produce|bench|serve --flag value ...");
            System.exit(2);
        }
        int rc;
        try {
            switch (argv[0]) {
                case "consume" -> rc = Consume.run(argv);
                case "produce" -> rc = Produce.run(argv);
                case "bench" -> rc = Bench.run(argv);
                case "serve" -> rc = Serve.run(argv);
                default -> throw new IllegalArgumentException("unknown subcommand " + argv[0]);
            }
        } catch (IllegalArgumentException e) {
            System.err.println("bad arguments: " + e.getMessage());
            rc = 2;
        }
        OUT.flush();
        // Client threads (netty, schedulers) may outlive shutdown(); end the JVM explicitly.
        System.exit(rc);
    }

    /** One JSON line on stdout, flushed, so a reader sees each line as it is written. */
    static void emit(Map<String, ?> line) {
        // WriteNulls: every documented key is on every line, null when it has no value.
        String s = JSON.toJSONString(line, JSONWriter.Feature.WriteNulls);
        synchronized (OUT) {
            OUT.println(s);
            OUT.flush();
        }
    }

    /**
     * The settings every client of the peer gets: the given name server (set explicitly, so the
     * client never asks an address server for one), 127.0.0.1 as its own address, no VIP channel
     * (the broker's listenPort-2), and an instance name of its own per process.
     */
    static void configure(ClientConfig cfg, String namesrv) {
        requireLoopback(namesrv);
        cfg.setNamesrvAddr(namesrv);
        cfg.setClientIP("127.0.0.1");
        cfg.setVipChannelEnabled(false);
        cfg.setInstanceName("qclient-peer-" + ProcessHandle.current().pid());
        cfg.setPollNameServerInterval(1000);
    }

    /** Rejects a name server list with any address outside the loopback range. */
    static void requireLoopback(String namesrv) {
        for (String hp : namesrv.split(";")) {
            int colon = hp.lastIndexOf(':');
            String host = colon > 0 ? hp.substring(0, colon) : hp;
            try {
                if (!InetAddress.getByName(host.trim()).isLoopbackAddress()) {
                    throw new IllegalArgumentException("--namesrv must be loopback, got " + hp);
                }
            } catch (UnknownHostException e) {
                throw new IllegalArgumentException("--namesrv host unknown: " + hp);
            }
        }
    }
}
