package dev.lockd.client;

import com.google.common.util.concurrent.ListenableFuture;
import fencing.lock.v1.Lock.AcquireAllRequest;
import fencing.lock.v1.Lock.AcquireAllResponse;
import fencing.lock.v1.Lock.AcquireRequest;
import fencing.lock.v1.Lock.AcquireResponse;
import fencing.lock.v1.Lock.DescribeRequest;
import fencing.lock.v1.Lock.DescribeResponse;
import fencing.lock.v1.Lock.NotGranted;
import fencing.lock.v1.Lock.ReleaseRequest;
import fencing.lock.v1.Lock.ReleaseResponse;
import fencing.lock.v1.Lock.RenewRequest;
import fencing.lock.v1.Lock.RenewResponse;
import fencing.lock.v1.LockServiceGrpc.LockServiceFutureStub;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashSet;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Function;

/**
 * A client of one or several lockd endpoints (any instance serves; after UNAVAILABLE the next is
 * tried). Thread-safe: share one per process, and close it at the end.
 *
 * <pre>{@code
 * try (LockdClient client = LockdClient.builder().endpoints("http://127.0.0.1:7420").build();
 *      Lock lock = client.acquire("inventory:sku-1",
 *              AcquireOptions.builder().ttl(Duration.ofSeconds(30)).wait(Duration.ofSeconds(10)).build())) {
 *     write(lock.fenceToken());
 * }
 * }</pre>
 */
public final class LockdClient implements AutoCloseable {
    /** How long transport failures are retried past the caller's wait before giving up. */
    static final long TRANSPORT_RETRY_FOR = TimeUnit.SECONDS.toNanos(10);
    /** Time allowed for a call beyond the wait it asks lockd for (network, fsync, queueing). */
    static final long CALL_GRACE = TimeUnit.SECONDS.toNanos(5);
    /** Longest wait asked for in one call (lockd's default wait_max_ms); a longer wait is made of several calls. */
    static final long CALL_WAIT_MAX = TimeUnit.SECONDS.toNanos(300);
    static final long CALL_TIMEOUT = TimeUnit.SECONDS.toNanos(10);

    /** Renewals and loss detection of every lock, on daemon threads. */
    static final ScheduledThreadPoolExecutor SCHEDULER;
    private static final ExecutorService ASYNC = Executors.newCachedThreadPool(daemon("lockd-acquire"));
    private static final SecureRandom RANDOM = new SecureRandom();

    static {
        SCHEDULER = new ScheduledThreadPoolExecutor(2, daemon("lockd-renew"));
        SCHEDULER.setRemoveOnCancelPolicy(true);
        SCHEDULER.setKeepAliveTime(30, TimeUnit.SECONDS);
        SCHEDULER.allowCoreThreadTimeOut(true);
        SCHEDULER.prestartCoreThread(); // a lock's first renewal is not late by a thread's start
    }

    private static ThreadFactory daemon(String name) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new Thread(r, name + "-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
    }

    final Settings settings;
    private final Endpoints endpoints;

    private LockdClient(Settings settings) {
        this.settings = settings;
        this.endpoints = new Endpoints(settings);
    }

    public static Builder builder() {
        return new Builder();
    }

    /** A fresh random request id (128 bits, URL-safe). */
    public static String newRequestId() {
        byte[] b = new byte[16];
        RANDOM.nextBytes(b);
        return Base64.getUrlEncoder().withoutPadding().encodeToString(b);
    }

    /** A fresh random owner id, for reentrant locks. */
    public static String newOwnerId() {
        return newRequestId();
    }

    /** Closes the connections. Locks still held stop renewing: they are lost at their local deadline. */
    @Override
    public void close() {
        endpoints.close();
    }

    // -- calls ----------------------------------------------------------------------------

    private static <T> T await(ListenableFuture<T> f, String what) throws StatusRuntimeException {
        try {
            return f.get();
        } catch (InterruptedException e) {
            f.cancel(true); // cancels the gRPC call: lockd forgets a waiter at once
            Thread.currentThread().interrupt();
            throw new CancelledException(what + " was cancelled (the thread was interrupted)");
        } catch (ExecutionException e) {
            StatusRuntimeException s = Errors.rpc(e.getCause());
            if (s != null) {
                throw s;
            }
            throw new UnavailableException(what + " failed: " + e.getCause(), e.getCause());
        }
    }

    private <T> T callOnce(Function<LockServiceFutureStub, ListenableFuture<T>> fn, long timeoutNanos, String what) {
        Endpoints.Pick p = endpoints.pick();
        try {
            return await(fn.apply(p.stub().withDeadlineAfter(timeoutNanos, TimeUnit.NANOSECONDS)), what);
        } catch (StatusRuntimeException e) {
            if (Errors.isTransient(e)) {
                endpoints.failed(p.index());
            }
            throw e;
        }
    }

    /**
     * A call other than an acquire, tried on each endpoint in turn while they are unreachable when
     * it is {@code repeatable}; otherwise (a release: a repeat would end one more hold of a
     * reentrant lease) on another only when it was never sent.
     */
    private <T> T call(Function<LockServiceFutureStub, ListenableFuture<T>> fn, long timeoutNanos, boolean repeatable,
            String what) {
        StatusRuntimeException last = null;
        for (int i = 0; i < endpoints.size(); i++) {
            try {
                return callOnce(fn, timeoutNanos, what);
            } catch (StatusRuntimeException e) {
                last = e;
                if (!(repeatable ? Errors.isTransient(e) : Errors.neverSent(e))) {
                    break;
                }
            }
        }
        throw Errors.of(last);
    }

    /** Renews a lease once, with a deadline of {@code timeoutNanos}, without waiting: for {@link Lock}'s renewals. */
    ListenableFuture<RenewResponse> renewAsync(String resource, String leaseId, long timeoutNanos) {
        Endpoints.Pick p = endpoints.pick();
        ListenableFuture<RenewResponse> f = p.stub().withDeadlineAfter(timeoutNanos, TimeUnit.NANOSECONDS)
                .renew(RenewRequest.newBuilder().setResource(resource).setLeaseId(leaseId).build());
        f.addListener(() -> {
            try {
                f.get();
            } catch (Exception e) {
                StatusRuntimeException s = Errors.rpc(e);
                if (s != null && Errors.isTransient(s)) {
                    endpoints.failed(p.index());
                }
            }
        }, Runnable::run);
        return f;
    }

    /** Renews a lease once (a {@link Lock} does this by itself); returns the lease's TTL. */
    public Duration renew(String resource, String leaseId) {
        RenewRequest req = RenewRequest.newBuilder().setResource(resource).setLeaseId(leaseId).build();
        RenewResponse r = call(s -> s.renew(req), CALL_TIMEOUT, true, "the renewal of " + resource);
        return Duration.ofMillis(r.getTtlMs());
    }

    /**
     * Releases a lease by its id (or one hold of a reentrant one): the low-level call, for a
     * lease handed over by {@link Lock#detach()}. True when this call ended it (or a hold of it);
     * false when it was not current.
     */
    public boolean release(String resource, String leaseId) {
        ReleaseRequest req = ReleaseRequest.newBuilder().setResource(resource).setLeaseId(leaseId).build();
        ReleaseResponse r = call(s -> s.release(req), CALL_TIMEOUT, false, "the release of " + resource);
        return r.getReleased();
    }

    /** Who holds {@code resource}, with which token, and how many wait. */
    public Description describe(String resource) {
        Settings.checkResource(resource);
        DescribeRequest req = DescribeRequest.newBuilder().setResource(resource).build();
        DescribeResponse d = call(s -> s.describe(req), CALL_TIMEOUT, true, "the describe of " + resource);
        return new Description(resource, d.getHeld(), d.getHolder(), d.getHeld() ? d.getToken() : 0, d.getWaiters(),
                d.getHeld() ? Math.max(d.getHolds(), 1) : 0, d.getHeld() ? d.getTtlMs() : 0, d.getPermits(),
                d.getPermitsHeld(), d.getReadWrite() ? d.getReaders() : -1);
    }

    // -- acquire ---------------------------------------------------------------------------

    /** {@link #acquire(String, AcquireOptions)} with the defaults: a try, lockd's default TTL. */
    public Lock acquire(String resource) {
        return acquire(resource, AcquireOptions.DEFAULT);
    }

    /**
     * Acquires the lock of {@code resource}, waiting up to the options' wait (zero: try once).
     * Blocks; interruptible: an interrupt cancels the call (lockd forgets the waiter) and throws
     * {@link CancelledException} with the thread's interrupt flag set again.
     *
     * <p>Throws {@link BusyException} (held, no wait), {@link WaitTimedOutException}, and the other
     * {@link LockdException}s. Transport failures are retried with the same request id (a grant
     * whose answer was lost is returned, never doubled) until 10 s past the wait.
     */
    public Lock acquire(String resource, AcquireOptions options) {
        Objects.requireNonNull(options, "options");
        options.check(resource);
        return doAcquire(resource, options, "");
    }

    /**
     * {@link #acquire(String, AcquireOptions)} on another thread. {@code cancel(true)} (or {@code
     * cancel(false)}) on the future cancels the wait, and lockd forgets the waiter; a grant that
     * comes in spite of the cancel is released.
     */
    public CompletableFuture<Lock> acquireAsync(String resource, AcquireOptions options) {
        Objects.requireNonNull(options, "options");
        options.check(resource);
        return async(() -> doAcquire(resource, options, ""), Lock::release);
    }

    interface Task<T> {
        T run();
    }

    static <T> CompletableFuture<T> async(Task<T> task, java.util.function.Consumer<T> undo) {
        final class Cancellable extends CompletableFuture<T> {
            volatile Future<?> running;

            @Override
            public boolean cancel(boolean mayInterruptIfRunning) {
                boolean done = super.cancel(mayInterruptIfRunning);
                Future<?> r = running;
                if (r != null) {
                    r.cancel(true);
                }
                return done;
            }
        }
        Cancellable cf = new Cancellable();
        cf.running = ASYNC.submit(() -> {
            try {
                T result = task.run();
                if (!cf.complete(result)) {
                    // Cancelled after the grant: give it back from a task of its own, as the
                    // cancel may interrupt this thread, and an interrupted thread's call fails
                    // at once (the lease would stay held until its TTL).
                    undoLater(result, undo);
                }
            } catch (Throwable t) {
                cf.completeExceptionally(t);
            }
        });
        if (cf.isCancelled()) {
            cf.running.cancel(true);
        }
        return cf;
    }

    /** Runs {@code undo} on a thread of its own; a failure leaves the lease to its TTL. */
    static <T> void undoLater(T result, java.util.function.Consumer<T> undo) {
        try {
            ASYNC.execute(() -> {
                try {
                    undo.accept(result);
                } catch (LockdException ignored) {
                    // the lease ends at its TTL
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException ignored) {
            // cannot happen with a cached pool; the lease would end at its TTL
        }
    }

    private static void sleep(long nanos, String what) {
        try {
            TimeUnit.NANOSECONDS.sleep(nanos);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CancelledException(what + " was cancelled (the thread was interrupted)");
        }
    }

    private static NotGrantedException notGranted(String resource, NotGranted ng, boolean waited) {
        long token = ng.getToken();
        String held = token != 0
                ? "; held by '" + ng.getHolder() + "' with token " + token + ", " + ng.getWaiters() + " waiting"
                : "";
        if (ng.getReason() == NotGranted.Reason.WAIT_TIMEOUT || waited) {
            return new WaitTimedOutException(resource + ": the wait ran out" + held, resource, ng.getHolder(), token,
                    ng.getWaiters());
        }
        return new BusyException(resource + ": busy" + held, resource, ng.getHolder(), token, ng.getWaiters());
    }

    /**
     * The error for an acquire under the caller's own request id whose grant has ended since:
     * acquiring again under it would grant one request twice (docs/api.md, {@code request_id}).
     */
    private static InvalidArgumentException grantEnded(String requestId) {
        return new InvalidArgumentException("request id \"" + requestId + "\" was granted before and that grant has "
                + "ended (released or expired): acquiring under it again would grant the same request twice; use a "
                + "new request id to acquire again");
    }

    private static long ms(Duration d) {
        return d == null ? 0 : Math.max(d.toMillis(), 0);
    }

    Lock doAcquire(String resource, AcquireOptions o, String downgrade) {
        String what = "the acquire of " + resource;
        String requestId = o.requestId() != null ? o.requestId() : newRequestId();
        long wait = o.waitTime().toNanos();
        long deadline = System.nanoTime() + wait;
        Backoff backoff = new Backoff();
        AcquireRequest.Mode mode = switch (o.mode()) {
            case READ -> AcquireRequest.Mode.READ;
            case WRITE -> AcquireRequest.Mode.WRITE;
            default -> AcquireRequest.Mode.MODE_UNSPECIFIED;
        };
        AcquireRequest[] sentReq = new AcquireRequest[1];
        try {
            return acquireLoop(resource, o, downgrade, what, requestId, wait, deadline, backoff, mode, sentReq);
        } catch (CancelledException e) {
            // A grant may have raced the cancel (or its answer was dropped): nobody would renew
            // or release it. Ask again with the same request id, without waiting, and release
            // whatever is granted. A downgrade is not repeated: it would convert a lease the
            // caller still holds.
            AcquireRequest last = sentReq[0];
            if (last != null && downgrade.isEmpty()) {
                cleanUp(resource, last.toBuilder().setWaitTimeoutMs(0).build());
            }
            throw e;
        }
    }

    /** How long the clean-up of an abandoned acquire tries before leaving the lease to its TTL. */
    static final long CLEANUP_FOR = TimeUnit.SECONDS.toNanos(10);

    /**
     * Releases, in the background, the grant an abandoned acquire may have left: the same
     * request again with a wait of zero answers it (duplicate) or takes the lock anew; either
     * way it is released.
     */
    private void cleanUp(String resource, AcquireRequest retry) {
        try {
            ASYNC.execute(() -> {
                long deadline = System.nanoTime() + CLEANUP_FOR;
                Backoff backoff = new Backoff();
                // Asked again whatever the resource looks like: the given-up call may still be on
                // its way to lockd, and a resource free now would be granted to it next. This call
                // either finds that grant, or comes first: granted (and released here), the late
                // call then finds that grant ended; busy, the late call joins the queue and its
                // cancellation, sent after it, takes it out.
                while (true) {
                    long left = deadline - System.nanoTime();
                    if (left <= 0) {
                        return;
                    }
                    try {
                        AcquireResponse r = callOnce(s -> s.acquire(retry), Math.min(left, CALL_TIMEOUT),
                                "the clean-up of the acquire of " + resource);
                        if (r.getOutcomeCase() == AcquireResponse.OutcomeCase.GRANTED) {
                            fencing.lock.v1.Lock.Lease lease = r.getGranted();
                            release(lease.getResource().isEmpty() ? resource : lease.getResource(),
                                    lease.getLeaseId());
                        }
                        return;
                    } catch (StatusRuntimeException e) {
                        if (!Errors.isTransient(e)) {
                            return;
                        }
                    } catch (RuntimeException e) {
                        return; // the lease, if any, ends at its TTL
                    }
                    try {
                        TimeUnit.NANOSECONDS.sleep(Math.min(backoff.nextDelayNanos(), Math.max(left, 0)));
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException ignored) {
            // cannot happen with a cached pool; the lease would end at its TTL
        }
    }

    private Lock acquireLoop(String resource, AcquireOptions o, String downgrade, String what, String requestId,
            long wait, long deadline, Backoff backoff, AcquireRequest.Mode mode, AcquireRequest[] sentReq) {
        while (true) {
            if (Thread.currentThread().isInterrupted()) {
                throw new CancelledException(what + " was cancelled (the thread was interrupted)");
            }
            long remaining = Math.max(deadline - System.nanoTime(), 0);
            long callWait = Math.min(remaining, CALL_WAIT_MAX);
            AcquireRequest req = AcquireRequest.newBuilder()
                    .setResource(resource)
                    .setRequestId(requestId)
                    .setTtlMs(ms(o.ttl()))
                    .setWaitTimeoutMs(TimeUnit.NANOSECONDS.toMillis(callWait))
                    .setHolder(o.holder() != null ? o.holder() : settings.holder)
                    .setOwner(o.owner() != null ? o.owner() : "")
                    .setPermits(o.permits())
                    .setMode(mode)
                    .setDowngradeLeaseId(downgrade)
                    .build();
            long sent = System.nanoTime();
            AcquireResponse resp;
            sentReq[0] = req;
            try {
                resp = callOnce(s -> s.acquire(req), callWait + CALL_GRACE, what);
            } catch (StatusRuntimeException e) {
                boolean transientFailure = Errors.isTransient(e);
                boolean exhausted = e.getStatus().getCode() == Status.Code.RESOURCE_EXHAUSTED;
                long budget = exhausted ? deadline : deadline + TRANSPORT_RETRY_FOR;
                if (!(transientFailure || exhausted) || System.nanoTime() - budget >= 0) {
                    throw Errors.of(e);
                }
                sleep(backoff.nextDelayNanos(), what);
                continue;
            }
            switch (resp.getOutcomeCase()) {
                case GRANTED -> {
                    fencing.lock.v1.Lock.Lease lease = resp.getGranted();
                    if (!lease.getDuplicate()) {
                        return new Lock(this, resource, lease, o.owner(), sent);
                    }
                    // The grant of an earlier attempt whose answer was lost: nobody renewed it and
                    // when it was made is unknown, so renew it now to learn a safe deadline. If it
                    // has ended under an id this call made, it was never used: ask anew; under the
                    // caller's own id it may have been, and is never granted twice.
                    if (lease.getHeld()) {
                        String leaseResource = lease.getResource().isEmpty() ? resource : lease.getResource();
                        long renewSent = System.nanoTime();
                        try {
                            renew(leaseResource, lease.getLeaseId());
                            return new Lock(this, resource, lease, o.owner(), renewSent);
                        } catch (LeaseNotCurrentException e) {
                            // ended meanwhile
                        } catch (UnavailableException e) {
                            // Not seen to end (the renewal did not get through): asked again
                            // under the same id, as a transport failure of the acquire is.
                            if (System.nanoTime() - (deadline + TRANSPORT_RETRY_FOR) >= 0) {
                                throw e;
                            }
                            sleep(backoff.nextDelayNanos(), what);
                            continue;
                        }
                    }
                    if (o.requestId() != null && !o.requestId().isEmpty()) {
                        throw grantEnded(requestId);
                    }
                    requestId = newRequestId();
                    continue;
                }
                case NOT_GRANTED -> {
                    sentReq[0] = null; // answered: nothing to clean up
                    if (System.nanoTime() - deadline >= 0) {
                        throw notGranted(resource, resp.getNotGranted(), wait > 0);
                    }
                }
                default -> throw new UnavailableException("lockd sent an empty AcquireResponse");
            }
            sleep(backoff.nextDelayNanos(), what);
        }
    }

    private static List<String> checkSet(List<String> resources) {
        for (String r : resources) {
            Settings.checkResource(r);
        }
        if (new HashSet<>(resources).size() != resources.size()) {
            throw new InvalidArgumentException("a resource is named twice in the set");
        }
        if (resources.isEmpty() || resources.size() > 32) {
            throw new InvalidArgumentException("a set has 1 to 32 resources");
        }
        List<String> sorted = new ArrayList<>(resources);
        sorted.sort(null);
        return sorted;
    }

    /**
     * Takes every resource at once, or none (one commit at lockd; at most 32), in the order given.
     * Try-only at lockd: with a wait, asked again with backoff until it ends. Throws {@link
     * BusyException} / {@link WaitTimedOutException} naming the first held member. Uses the
     * options' ttl, wait, requestId and holder.
     */
    public LockSet acquireAll(List<String> resources, AcquireOptions o) {
        List<String> given = List.copyOf(resources);
        checkSet(given);
        AcquireAllRequest[] inFlight = new AcquireAllRequest[1];
        try {
            return acquireAllLoop(given, o, inFlight);
        } catch (CancelledException e) {
            AcquireAllRequest last = inFlight[0];
            if (last != null) {
                cleanUpAll(given, last); // a grant that raced the cancel is released
            }
            throw e;
        }
    }

    /** {@link #cleanUp} for a set: the same AcquireAll again; a grant is released, member by member. */
    private void cleanUpAll(List<String> given, AcquireAllRequest retry) {
        ASYNC.execute(() -> {
            long deadline = System.nanoTime() + CLEANUP_FOR;
            Backoff backoff = new Backoff();
            while (true) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return;
                }
                try {
                    AcquireAllResponse r = callOnce(s -> s.acquireAll(retry), Math.min(left, CALL_TIMEOUT),
                            "the clean-up of the acquire of the set " + given);
                    if (r.getOutcomeCase() == AcquireAllResponse.OutcomeCase.GRANTED) {
                        List<fencing.lock.v1.Lock.Lease> leases = r.getGranted().getLeasesList();
                        for (int i = 0; i < leases.size(); i++) {
                            fencing.lock.v1.Lock.Lease l = leases.get(i);
                            String res = !l.getResource().isEmpty() ? l.getResource()
                                    : i < given.size() ? given.get(i) : null;
                            if (res != null) {
                                try {
                                    release(res, l.getLeaseId());
                                } catch (LockdException ignored) {
                                    // it ends at its TTL
                                }
                            }
                        }
                    }
                    return;
                } catch (StatusRuntimeException e) {
                    if (!Errors.isTransient(e)) {
                        return;
                    }
                } catch (RuntimeException e) {
                    return;
                }
                try {
                    TimeUnit.NANOSECONDS.sleep(Math.min(backoff.nextDelayNanos(), Math.max(left, 0)));
                } catch (InterruptedException e) {
                    return;
                }
            }
        });
    }

    private LockSet acquireAllLoop(List<String> given, AcquireOptions o, AcquireAllRequest[] inFlight) {
        String what = "the acquire of the set " + given;
        String requestId = o.requestId() != null ? o.requestId() : newRequestId();
        long wait = o.waitTime().toNanos();
        long deadline = System.nanoTime() + wait;
        Backoff backoff = new Backoff();
        while (true) {
            if (Thread.currentThread().isInterrupted()) {
                throw new CancelledException(what + " was cancelled (the thread was interrupted)");
            }
            AcquireAllRequest req = AcquireAllRequest.newBuilder()
                    .addAllResources(given)
                    .setRequestId(requestId)
                    .setTtlMs(ms(o.ttl()))
                    .setHolder(o.holder() != null ? o.holder() : settings.holder)
                    .build();
            long sent = System.nanoTime();
            AcquireAllResponse resp;
            inFlight[0] = req;
            try {
                resp = callOnce(s -> s.acquireAll(req), CALL_GRACE, what);
            } catch (StatusRuntimeException e) {
                if (!Errors.isTransient(e) || System.nanoTime() - (deadline + TRANSPORT_RETRY_FOR) >= 0) {
                    throw Errors.of(e);
                }
                sleep(backoff.nextDelayNanos(), what);
                continue;
            }
            if (resp.getOutcomeCase() == AcquireAllResponse.OutcomeCase.GRANTED) {
                List<fencing.lock.v1.Lock.Lease> leases = resp.getGranted().getLeasesList();
                if (leases.size() != given.size()) {
                    throw new UnavailableException(
                            "lockd answered " + leases.size() + " leases for " + given.size() + " resources");
                }
                boolean duplicate = leases.stream().anyMatch(fencing.lock.v1.Lock.Lease::getDuplicate);
                if (duplicate) {
                    sent = System.nanoTime();
                    try {
                        for (int i = 0; i < leases.size(); i++) {
                            fencing.lock.v1.Lock.Lease l = leases.get(i);
                            renew(l.getResource().isEmpty() ? given.get(i) : l.getResource(), l.getLeaseId());
                        }
                    } catch (LeaseNotCurrentException e) {
                        if (o.requestId() != null && !o.requestId().isEmpty()) {
                            throw grantEnded(requestId);
                        }
                        requestId = newRequestId();
                        continue;
                    } catch (UnavailableException e) {
                        // Not seen to end: asked again under the same id.
                        if (System.nanoTime() - (deadline + TRANSPORT_RETRY_FOR) >= 0) {
                            throw e;
                        }
                        sleep(backoff.nextDelayNanos(), what);
                        continue;
                    }
                }
                List<Lock> locks = new ArrayList<>();
                for (int i = 0; i < leases.size(); i++) {
                    locks.add(new Lock(this, given.get(i), leases.get(i), null, sent));
                }
                return new LockSet(locks);
            }
            inFlight[0] = null; // answered: nothing to clean up
            if (System.nanoTime() - deadline >= 0) {
                String busy = resp.getBusyResource().isEmpty() ? given.get(0) : resp.getBusyResource();
                throw notGranted(busy, resp.getNotGranted(), wait > 0);
            }
            sleep(backoff.nextDelayNanos(), what);
        }
    }

    /** {@link #acquireAll(List, AcquireOptions)} of the named resources. */
    public LockSet acquireAll(AcquireOptions o, String... resources) {
        return acquireAll(Arrays.asList(resources), o);
    }

    /**
     * Takes each lock in sorted order, waiting in each queue, within one wait; on any failure
     * releases those taken, last first. Two callers never deadlock. Uses the options' ttl, wait
     * and holder (not a request id: each lock gets its own).
     */
    public LockSet acquireOrdered(List<String> resources, AcquireOptions o) {
        List<String> ordered = checkSet(List.copyOf(resources));
        long deadline = System.nanoTime() + o.waitTime().toNanos();
        List<Lock> taken = new ArrayList<>();
        try {
            for (String r : ordered) {
                long left = Math.max(deadline - System.nanoTime(), 0);
                AcquireOptions each = o.toBuilder().requestId(null).wait(Duration.ofNanos(left)).build();
                each.check(r);
                taken.add(doAcquire(r, each, ""));
            }
        } catch (RuntimeException | Error e) {
            for (int i = taken.size() - 1; i >= 0; i--) {
                try {
                    taken.get(i).release();
                } catch (LockdException ignored) {
                    // it ends at its TTL
                }
            }
            throw e;
        }
        return new LockSet(taken);
    }

    /** {@link #acquireOrdered(List, AcquireOptions)} of the named resources. */
    public LockSet acquireOrdered(AcquireOptions o, String... resources) {
        return acquireOrdered(Arrays.asList(resources), o);
    }

    /** Builds a {@link LockdClient}; every setting is checked by {@link #build()}. */
    public static final class Builder {
        private List<String> endpoints;
        private Path ca;
        private Path cert;
        private Path key;
        private String token;
        private Path tokenFile;
        private String holder;

        private Builder() {
        }

        /**
         * lockd's endpoints, {@code http://HOST:PORT} or {@code https://HOST:PORT} (one scheme for
         * all), tried in order. Default: {@code $LOCKD_ENDPOINT} (comma-separated), else
         * http://127.0.0.1:7420.
         */
        public Builder endpoints(String... urls) {
            this.endpoints = Arrays.asList(urls);
            return this;
        }

        public Builder endpoints(List<String> urls) {
            this.endpoints = List.copyOf(urls);
            return this;
        }

        /** The CA that signed lockd's certificate (https:// only; default: the system's). */
        public Builder caFile(Path ca) {
            this.ca = ca;
            return this;
        }

        /** A client certificate and its key (PEM, the key in PKCS#8), for mutual TLS. */
        public Builder clientCert(Path cert, Path key) {
            this.cert = cert;
            this.key = key;
            return this;
        }

        /** A bearer token for a lockd with a policy (refused over plaintext to another host). */
        public Builder bearerToken(String token) {
            this.token = token;
            return this;
        }

        /** A file holding the bearer token. */
        public Builder bearerTokenFile(Path file) {
            this.tokenFile = file;
            return this;
        }

        /** How this process describes itself to lockd (default: host:pid). */
        public Builder holder(String holder) {
            this.holder = holder;
            return this;
        }

        /**
         * The client. Throws {@link EndpointException} for a bad URL, mixed schemes, TLS files with
         * http:// or a bearer token over plaintext to another host, and {@link
         * InvalidArgumentException} for a certificate without its key or an unreadable file.
         */
        public LockdClient build() {
            return new LockdClient(Settings.of(endpoints, ca, cert, key, token, tokenFile, holder));
        }
    }
}
