package dev.lockd.bench;

import dev.lockd.client.AcquireOptions;
import dev.lockd.client.Lock;
import dev.lockd.client.LockdClient;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.redisson.Redisson;
import org.redisson.api.RFencedLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

/**
 * The Java half of bench/sdk.sh: N holders (threads), each acquiring and releasing its own
 * resource as fast as answers come for a while, through the SDK or through Redisson's
 * RFencedLock (the fenced lock a Java team would otherwise pick) against Redis; one JSON line.
 *
 * <pre>mvn -q compile exec:java -Dexec.args="lockd http://127.0.0.1:17420 64 10"
 * mvn -q compile exec:java -Dexec.args="redisson redis://127.0.0.1:16379 64 10"</pre>
 */
public final class Bench {
    interface Pair {
        void run(int i) throws Exception;
    }

    public static void main(String[] args) throws Exception {
        String target = args[0];
        String endpoint = args[1];
        int clients = Integer.parseInt(args[2]);
        double seconds = Double.parseDouble(args[3]);
        String run = ProcessHandle.current().pid() + "-" + System.currentTimeMillis();
        Pair pair;
        String name;
        AutoCloseable close;
        if (target.equals("lockd")) {
            LockdClient client = LockdClient.builder().endpoints(endpoint).build();
            AcquireOptions opts = AcquireOptions.builder().ttl(Duration.ofSeconds(30)).build();
            name = "java sdk";
            pair = i -> {
                Lock lock = client.acquire("javabench-" + run + "-" + i, opts);
                lock.release();
            };
            close = client;
        } else {
            Config config = new Config();
            config.useSingleServer().setAddress(endpoint).setConnectionPoolSize(clients).setConnectionMinimumIdleSize(clients);
            RedissonClient redisson = Redisson.create(config);
            name = "redisson RFencedLock";
            pair = i -> {
                RFencedLock lock = redisson.getFencedLock("javabench-" + run + "-" + i);
                Long token = lock.tryLockAndGetToken(0, 30, TimeUnit.SECONDS);
                if (token == null) {
                    throw new IllegalStateException("not granted");
                }
                lock.unlock();
            };
            close = redisson::shutdown;
        }
        // A JVM serves warm: 2 s of the same load first, not counted (for both systems), so
        // that the JIT has compiled the paths measured.
        measure(pair, clients, 2.0, new AtomicLong(), new AtomicLong());
        AtomicLong pairs = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        double took = measure(pair, clients, seconds, pairs, errors);
        close.close();
        System.out.printf("{\"sdk\": \"%s\", \"clients\": %d, \"pairs\": %d, \"errors\": %d, \"seconds\": %.3f, \"pairs_per_s\": %.1f}%n",
                name, clients, pairs.get(), errors.get(), took, pairs.get() / took);
        System.exit(0);
    }

    static double measure(Pair pair, int clients, double seconds, AtomicLong pairs, AtomicLong errors)
            throws InterruptedException {
        long stop = System.nanoTime() + (long) (seconds * 1e9);
        long began = System.nanoTime();
        List<Thread> threads = new ArrayList<>();
        for (int c = 0; c < clients; c++) {
            int i = c;
            Thread t = new Thread(() -> {
                while (System.nanoTime() < stop) {
                    try {
                        pair.run(i);
                        pairs.incrementAndGet();
                    } catch (Exception e) {
                        errors.incrementAndGet();
                    }
                }
            });
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) {
            t.join();
        }
        return (System.nanoTime() - began) / 1e9;
    }
}
