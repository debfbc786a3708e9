package dev.lockd.client;

import fencing.lock.v1.LockServiceGrpc;
import fencing.lock.v1.LockServiceGrpc.LockServiceFutureStub;
import io.grpc.Grpc;
import io.grpc.ManagedChannel;
import io.grpc.stub.MetadataUtils;
import java.util.concurrent.TimeUnit;

/** One channel per endpoint, made on first use; calls go to the current one and move on after a failure. */
final class Endpoints {
    record Pick(int index, LockServiceFutureStub stub) {
    }

    private final Settings settings;
    private final ManagedChannel[] channels;
    private final LockServiceFutureStub[] stubs;
    private int current;
    private boolean closed;

    Endpoints(Settings settings) {
        this.settings = settings;
        this.channels = new ManagedChannel[settings.endpoints.size()];
        this.stubs = new LockServiceFutureStub[settings.endpoints.size()];
    }

    int size() {
        return channels.length;
    }

    synchronized Pick pick() {
        if (closed) {
            throw new UnavailableException("the client is closed");
        }
        int i = current;
        if (stubs[i] == null) {
            Settings.Endpoint ep = settings.endpoints.get(i);
            ManagedChannel ch = Grpc.newChannelBuilderForAddress(ep.host(), ep.port(), settings.credentials)
                    .keepAliveTime(10, TimeUnit.SECONDS)
                    .keepAliveTimeout(20, TimeUnit.SECONDS)
                    .keepAliveWithoutCalls(false)
                    .userAgent("lockd-client-java")
                    // Answers complete their futures on the transport's thread: one hand-off less per call
                    // (every listener of ours either is trivial or names its own executor).
                    .directExecutor()
                    .build();
            channels[i] = ch;
            stubs[i] = LockServiceGrpc.newFutureStub(ch)
                    .withInterceptors(MetadataUtils.newAttachHeadersInterceptor(settings.headers));
        }
        return new Pick(i, stubs[i]);
    }

    synchronized void failed(int i) {
        if (current == i) {
            current = (i + 1) % channels.length;
        }
    }

    synchronized void close() {
        closed = true;
        for (ManagedChannel ch : channels) {
            if (ch != null) {
                ch.shutdownNow();
            }
        }
    }
}
