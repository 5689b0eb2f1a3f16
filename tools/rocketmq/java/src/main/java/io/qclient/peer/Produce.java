package io.qclient.peer;

import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;

/**
 * {@code produce}: N single synchronous sends, one line each:
 * {@code {"uniqKey","msgId","status","queueId","queueOffset","brokerName","recallHandle",
 * "deliverAtMs","keys","sentMs"}}, or {@code {"index","error"}} for a send that threw.
 * {@code msgId} is the broker's offset id; for a timer message it and queueId/queueOffset name
 * the copy in the timer topic. In --body and --keys, {i} stands for the message's index.
 * Returns 1 when any send failed.
 */
final class Produce {
    private static final Set<String> FLAGS = Set.of("namesrv", "topic", "count", "delay-ms",
            "deliver-at-ms", "tags", "keys", "prop", "body", "group", "send-timeout-ms");

    private Produce() {}

    static int run(String[] argv) throws Exception {
        Args a = new Args(argv, 1, FLAGS, Set.of("prop"));
        String topic = a.required("topic");
        long count = a.num("count", 1);
        String tags = a.str("tags", null);
        String keys = a.str("keys", null);
        String body = a.str("body", "java-peer-{i}");
        Map<String, String> props = a.pairs("prop");
        long delayMs = a.num("delay-ms", 0);
        long deliverAtMs = a.num("deliver-at-ms", 0);
        DefaultMQProducer producer = new DefaultMQProducer(a.str("group", "qclient-java-peer-producer"));
        Main.configure(producer, a.required("namesrv"));
        // the client's default (3 s) unless given: tests on a loaded host give more
        producer.setSendMsgTimeout((int) a.num("send-timeout-ms", producer.getSendMsgTimeout()));
        producer.start();
        int failed = 0;
        try {
            for (long i = 0; i < count; i++) {
                String idx = Long.toString(i);
                Message m = new Message(topic, tags, keys == null ? null : keys.replace("{i}", idx),
                        body.replace("{i}", idx).getBytes(StandardCharsets.UTF_8));
                props.forEach(m::putUserProperty);
                long at = deliverAtMs > 0 ? deliverAtMs
                        : delayMs > 0 ? System.currentTimeMillis() + delayMs : 0;
                if (at > 0) {
                    m.setDeliverTimeMs(at);
                }
                Map<String, Object> o = new LinkedHashMap<>();
                try {
                    SendResult r = producer.send(m);
                    o.put("uniqKey", r.getMsgId());
                    o.put("msgId", r.getOffsetMsgId());
                    o.put("status", r.getSendStatus().name());
                    o.put("queueId", r.getMessageQueue().getQueueId());
                    o.put("queueOffset", r.getQueueOffset());
                    o.put("brokerName", r.getMessageQueue().getBrokerName());
                    o.put("recallHandle", r.getRecallHandle());
                } catch (Exception e) {
                    failed++;
                    o.put("index", i);
                    o.put("error", Bench.describe(e));
                }
                o.put("deliverAtMs", at > 0 ? at : null);
                o.put("keys", m.getKeys());
                o.put("sentMs", System.currentTimeMillis());
                Main.emit(o);
            }
        } finally {
            producer.shutdown();
        }
        return failed == 0 ? 0 : 1;
    }
}
