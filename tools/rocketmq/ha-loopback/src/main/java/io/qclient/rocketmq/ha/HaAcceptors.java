package io.qclient.rocketmq.ha;

import java.io.IOException;
import java.lang.reflect.Field;
import java.net.InetSocketAddress;
import org.apache.rocketmq.common.constant.LoggerName;
import org.apache.rocketmq.logging.org.slf4j.Logger;
import org.apache.rocketmq.logging.org.slf4j.LoggerFactory;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.ha.DefaultHAService;
import org.apache.rocketmq.store.ha.HAService;
import org.apache.rocketmq.store.ha.autoswitch.AutoSwitchHAService;

/**
 * Points an HA acceptor at the broker's own HA address and swaps a store's stock HA service
 * for one that does.
 *
 * <p>RocketMQ 5.5.0's {@code DefaultHAService.AcceptSocketService} keeps the address it will
 * bind in a private final field set by its constructor, {@code new
 * InetSocketAddress(haListenPort)}: the wildcard address. Before {@code beginAccept()} binds
 * it, that field is replaced by {@code brokerIP2:haListenPort}, the address the broker
 * advertises to its slaves ({@code BrokerController.getHAServerAddr()}), so the acceptor
 * listens exactly where slaves are told to connect. Reflection on a private field ties this
 * to 5.5.0's layout: a jar that does not have it fails the broker's start loudly rather than
 * let it listen on every interface.
 */
final class HaAcceptors {
    private static final Logger LOG = LoggerFactory.getLogger(LoggerName.STORE_LOGGER_NAME);
    private static final String ADDRESS_FIELD = "socketAddressListen";
    private static final String STORE_FIELD = "haService";

    private HaAcceptors() {
    }

    /**
     * Make {@code acceptor} (a {@code DefaultHAService.AcceptSocketService} not yet started)
     * bind brokerIP2 at the port it was built with.
     */
    static void bindToBrokerIp2(Object acceptor, DefaultMessageStore store) throws IOException {
        String host = store.getBrokerConfig().getBrokerIP2();
        Field field = declaredField(acceptor.getClass(), ADDRESS_FIELD);
        try {
            InetSocketAddress configured = (InetSocketAddress) field.get(acceptor);
            InetSocketAddress bound = new InetSocketAddress(host, configured.getPort());
            if (bound.isUnresolved()) {
                throw new IOException("brokerIP2 " + host + " does not resolve: no HA acceptor");
            }
            field.set(acceptor, bound);
            LOG.info("HA acceptor bound to brokerIP2: {}", bound);
        } catch (IllegalAccessException | ClassCastException e) {
            throw new IOException("cannot bind the HA acceptor to brokerIP2 " + host, e);
        }
    }

    /**
     * Replace {@code store}'s HA service, created by its constructor and not yet initialised,
     * by the one of this module that binds brokerIP2: AutoSwitchHAService (controller mode) by
     * BrokerIp2AutoSwitchHAService, DefaultHAService by BrokerIp2HAService. Anything else (none
     * with DLedger, a subclass already, another HAService) is left alone.
     */
    static void swapHaService(DefaultMessageStore store) throws IOException {
        HAService current = store.getHaService();
        HAService replacement;
        if (current == null) {
            return;
        } else if (current.getClass() == AutoSwitchHAService.class) {
            replacement = new BrokerIp2AutoSwitchHAService();
        } else if (current.getClass() == DefaultHAService.class) {
            replacement = new BrokerIp2HAService();
        } else {
            return;
        }
        Field field = declaredField(store.getClass(), STORE_FIELD);
        try {
            field.set(store, replacement);
        } catch (IllegalAccessException e) {
            throw new IOException("cannot replace the store's " + current.getClass().getName(), e);
        }
        // the stock service was only constructed: AutoSwitchHAService owns an executor that
        // has started no thread; shutting it down releases it (the rest is still null)
        current.shutdown();
        LOG.info("HA service {} replaced by {}", current.getClass().getSimpleName(),
            replacement.getClass().getSimpleName());
    }

    /** The field {@code name} declared by {@code type} or a superclass, made accessible. */
    private static Field declaredField(Class<?> type, String name) throws IOException {
        for (Class<?> c = type; c != null; c = c.getSuperclass()) {
            try {
                Field field = c.getDeclaredField(name);
                field.setAccessible(true);
                return field;
            } catch (NoSuchFieldException e) {
                // a superclass may declare it
            }
        }
        throw new IOException(type.getName() + " has no field " + name
            + " (not RocketMQ 5.5.0's layout): the HA acceptor cannot be bound to brokerIP2");
    }
}
