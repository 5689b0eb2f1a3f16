package io.qclient.rocketmq.ha;

import java.io.IOException;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.ha.DefaultHAService;

/**
 * DefaultHAService whose acceptor listens on brokerIP2 instead of every interface.
 *
 * <p>A lone master (or a classic master/slave pair) loads it in place of DefaultHAService:
 * {@code DefaultMessageStore} asks {@code ServiceProvider.loadClass(HAService.class)}, which
 * reads {@code META-INF/service/org.apache.rocketmq.store.ha.HAService} from the classpath.
 */
public class BrokerIp2HAService extends DefaultHAService {
    @Override
    public void init(DefaultMessageStore store) throws IOException {
        super.init(store);
        HaAcceptors.bindToBrokerIp2(this.acceptSocketService, store);
    }
}
