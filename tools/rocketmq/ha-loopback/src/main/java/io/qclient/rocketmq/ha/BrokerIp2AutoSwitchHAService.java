package io.qclient.rocketmq.ha;

import java.io.IOException;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.ha.autoswitch.AutoSwitchHAService;

/**
 * AutoSwitchHAService (controller mode, RIP-44) whose acceptor listens on brokerIP2 instead
 * of every interface. DefaultMessageStore creates AutoSwitchHAService directly in controller
 * mode, so BrokerIp2HAPlugin puts this one in its place.
 */
public class BrokerIp2AutoSwitchHAService extends AutoSwitchHAService {
    @Override
    public void init(DefaultMessageStore store) throws IOException {
        super.init(store);
        HaAcceptors.bindToBrokerIp2(this.acceptSocketService, store);
    }
}
