package io.qclient.peer;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * {@code consume}: a clustering lite-pull consumer from the first offset that prints one line
 * per message and a final {@code {"done":true,"count":n,"timedOut":b}}. It stops once it has
 * printed at least {@code --count} messages (every message of the last poll is printed, so the
 * count may exceed N by part of one pull batch; nothing consumed goes unreported) or at
 * {@code --timeout-ms}. With {@code --settle-ms} it goes on polling that long after the count,
 * so copies beyond it (duplicates, messages never acknowledged) show up too; it does not
 * drop a unique key it has already printed. With {@code --stop-file PATH} it also stops (and
 * commits) once that file exists: a caller that watches the lines decides when it has enough.
 */
final class Consume {
    private static final Set<String> FLAGS =
            Set.of("namesrv", "topic", "group", "count", "timeout-ms", "tags", "pull-batch-size",
                    "settle-ms", "stop-file");

    private Consume() {}

    static int run(String[] argv) throws Exception {
        Args a = new Args(argv, 1, FLAGS, Set.of());
        String topic = a.required("topic");
        long count = a.num("count", 1);
        long timeoutMs = a.num("timeout-ms", 30_000);
        long settleMs = a.num("settle-ms", 0);
        String stopFile = a.str("stop-file", null);
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(a.required("group"));
        Main.configure(consumer, a.required("namesrv"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setAutoCommit(true);
        consumer.setPullBatchSize(a.integer("pull-batch-size", 32));
        consumer.subscribe(topic, a.str("tags", "*"));
        long deadline = System.currentTimeMillis() + timeoutMs;
        long n = 0;
        consumer.start();
        try {
            long settleUntil = -1;
            while (true) {
                if (stopFile != null && Files.exists(Path.of(stopFile))) {
                    break;
                }
                if (n >= count) {
                    if (settleMs <= 0) {
                        break;
                    }
                    if (settleUntil < 0) { // the count reached: poll --settle-ms more
                        settleUntil = System.currentTimeMillis() + settleMs;
                    }
                }
                long end = settleUntil < 0 ? deadline : Math.min(deadline, settleUntil);
                long left = end - System.currentTimeMillis();
                if (left <= 0) {
                    break;
                }
                List<MessageExt> batch = consumer.poll(Math.min(left, 200));
                long receivedMs = System.currentTimeMillis();
                for (MessageExt m : batch) {
                    Main.emit(line(m, receivedMs));
                    n++;
                }
            }
            consumer.commitSync();
        } finally {
            consumer.shutdown();
        }
        Map<String, Object> done = new LinkedHashMap<>();
        done.put("done", true);
        done.put("count", n);
        done.put("timedOut", n < count);
        Main.emit(done);
        return 0;
    }

    private static Map<String, Object> line(MessageExt m, long receivedMs) {
        Map<String, Object> o = new LinkedHashMap<>();
        o.put("uniqKey", MessageClientIDSetter.getUniqID(m));
        // The broker's id (store host + commit log offset); a client-side MessageExt reports
        // the unique key from getMsgId().
        o.put("msgId", m instanceof MessageClientExt c ? c.getOffsetMsgId() : m.getMsgId());
        o.put("topic", m.getTopic());
        o.put("tags", m.getTags());
        o.put("keys", m.getKeys());
        o.put("body_b64", Base64.getEncoder().encodeToString(m.getBody()));
        o.put("properties", m.getProperties());
        o.put("bornTimestamp", m.getBornTimestamp());
        o.put("storeTimestamp", m.getStoreTimestamp());
        o.put("receivedMs", receivedMs);
        o.put("queueId", m.getQueueId());
        o.put("queueOffset", m.getQueueOffset());
        o.put("brokerName", m.getBrokerName());
        o.put("reconsumeTimes", m.getReconsumeTimes());
        return o;
    }
}
