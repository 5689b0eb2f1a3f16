package io.qclient.rocketmq.ha;

import java.io.IOException;
import java.util.concurrent.CompletableFuture;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.MessageStore;
import org.apache.rocketmq.store.QueryMessageResult;
import org.apache.rocketmq.store.plugin.AbstractPluginMessageStore;
import org.apache.rocketmq.store.plugin.MessageStorePluginContext;
import org.apache.rocketmq.store.rocksdb.MessageRocksDBStorage;
import org.apache.rocketmq.store.timer.rocksdb.TimerMessageRocksDBStore;
import org.apache.rocketmq.store.transaction.TransMessageRocksDBStore;

/**
 * A message store plugin ({@code messageStorePlugIn=io.qclient.rocketmq.ha.BrokerIp2HAPlugin})
 * that gives the broker's store an HA service listening on brokerIP2, then passes every call
 * through to the store.
 *
 * <p>In controller mode {@code DefaultMessageStore} creates AutoSwitchHAService directly, not
 * through {@code ServiceProvider}; the broker builds plugins right after the store's
 * constructor, before anything else holds the HA service ({@code ReplicasManager} takes it
 * later) and before {@code start()} initialises it, so the swap is complete.
 *
 * <p>The broker then holds this wrapper, not the {@code DefaultMessageStore}: the few 5.5.0
 * code paths that test {@code instanceof DefaultMessageStore} on it (thread names inside a
 * broker container, cold-data flow control, the commit-log read-ahead admin command and the
 * transient pool's figure in the runtime info) act as for any plugin store.
 */
public class BrokerIp2HAPlugin extends AbstractPluginMessageStore {
    public BrokerIp2HAPlugin(MessageStorePluginContext context, MessageStore next)
        throws IOException {
        super(context, next);
        MessageStore store = next;
        while (store instanceof AbstractPluginMessageStore) {
            store = ((AbstractPluginMessageStore) store).getNext();
        }
        if (store instanceof DefaultMessageStore) {
            HaAcceptors.swapHaService((DefaultMessageStore) store);
        }
    }

    // --- what 5.5.0's AbstractPluginMessageStore leaves abstract: passed through ------------

    @Override
    public QueryMessageResult queryMessage(String topic, String key, int maxNum, long begin,
        long end, String indexType, String lastKey) {
        return next.queryMessage(topic, key, maxNum, begin, end, indexType, lastKey);
    }

    @Override
    public CompletableFuture<QueryMessageResult> queryMessageAsync(String topic, String key,
        int maxNum, long begin, long end, String indexType, String lastKey) {
        return next.queryMessageAsync(topic, key, maxNum, begin, end, indexType, lastKey);
    }

    @Override
    public MessageRocksDBStorage getMessageRocksDBStorage() {
        return next.getMessageRocksDBStorage();
    }

    @Override
    public TimerMessageRocksDBStore getTimerMessageRocksDBStore() {
        return next.getTimerMessageRocksDBStore();
    }

    @Override
    public void setTimerMessageRocksDBStore(TimerMessageRocksDBStore store) {
        next.setTimerMessageRocksDBStore(store);
    }

    @Override
    public TransMessageRocksDBStore getTransMessageRocksDBStore() {
        return next.getTransMessageRocksDBStore();
    }

    @Override
    public void setTransMessageRocksDBStore(TransMessageRocksDBStore store) {
        next.setTransMessageRocksDBStore(store);
    }
}
