package dev.lockd.client;

import com.google.common.util.concurrent.ListenableFuture;
import fencing.lock.v1.Lock.RenewResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * A held lock: renews itself every third of its TTL (±10%) and says when it is lost.
 *
 * <p>Lost is final: {@link #isLost()} turns true, {@link #onLost()} completes and the listeners run
 * (on the SDK's renewal thread: keep them short) when lockd refuses a renewal, or when no renewal
 * was confirmed before the lease's local deadline: the send time of the request that last extended
 * it, plus the TTL, minus a safety margin (a tenth of the TTL, at least 10 ms). That deadline ends
 * before lockd's, so stop working under the token when it fires.
 *
 * <p>{@link #release()} is idempotent; {@link #close()} releases, for try-with-resources.
 */
public final class Lock implements AutoCloseable, Fenceable {
    private static final Logger LOG = Logger.getLogger("dev.lockd.client");

    private final LockdClient client;
    private final String resource;
    private final String leaseId;
    private final long token;
    private final String signedToken;
    private final int holds;
    private final String owner;
    private final long ttlNanos;
    private final long marginNanos;

    private final Object mu = new Object();
    private final Backoff backoff = new Backoff();
    private final List<Consumer<LostReason>> listeners = new ArrayList<>();
    private final CompletableFuture<LostReason> lost = new CompletableFuture<>();
    private long deadline;
    private long nextAt;
    private boolean inFlight;
    private boolean ended;
    private LostReason lostReason;
    private String lostDetail;
    private ScheduledFuture<?> timer;
    private final Runnable tickTask = this::tick;

    Lock(LockdClient client, String asked, fencing.lock.v1.Lock.Lease lease, String owner, long extendedAt) {
        this.client = client;
        this.resource = lease.getResource().isEmpty() ? asked : lease.getResource();
        this.leaseId = lease.getLeaseId();
        this.token = lease.getToken();
        this.signedToken = lease.getSignedToken().isEmpty() ? null : lease.getSignedToken();
        this.holds = Math.max(lease.getHolds(), 1);
        this.owner = owner;
        this.ttlNanos = TimeUnit.MILLISECONDS.toNanos(lease.getTtlMs());
        this.marginNanos = safetyMargin(ttlNanos);
        this.deadline = extendedAt + ttlNanos - marginNanos;
        this.nextAt = extendedAt + Backoff.jittered(ttlNanos / 3);
        synchronized (mu) {
            schedule();
        }
    }

    /** How much earlier than lockd a lease is taken as over: a tenth of the TTL, at least 10 ms. */
    static long safetyMargin(long ttlNanos) {
        return Math.max(ttlNanos / 10, TimeUnit.MILLISECONDS.toNanos(10));
    }

    // -- what the lease is ---------------------------------------------------------------

    /** The resource the lease is on: the one asked for, for a semaphore its permit's, for a reader its slot's. */
    @Override
    public String resource() {
        return resource;
    }

    /** The fencing token's number. */
    public long token() {
        return token;
    }

    /** The token signed by lockd ({@code TOKEN.KEY_ID.MAC}), when lockd signs tokens. */
    public Optional<String> signedToken() {
        return Optional.ofNullable(signedToken);
    }

    /** The token to attach to every write: the signed form when lockd signs, else the number. */
    @Override
    public String fenceToken() {
        return signedToken != null ? signedToken : Long.toString(token);
    }

    /** How many times the owner held the lease when this lock was granted (1 unless re-entered). */
    public int holds() {
        return holds;
    }

    /** The lease's length, as lockd granted it. */
    public Duration ttl() {
        return Duration.ofNanos(ttlNanos);
    }

    /** The lease id: the capability to renew and release. Keep it secret (never logged by the SDK). */
    public String leaseId() {
        return leaseId;
    }

    /** The owner it was acquired with (reentrancy), or null. */
    public String owner() {
        return owner;
    }

    LockdClient client() {
        return client;
    }

    /** How long until the local deadline (zero or negative once passed). */
    public Duration remaining() {
        synchronized (mu) {
            return Duration.ofNanos(deadline - System.nanoTime());
        }
    }

    @Override
    public String toString() {
        String state;
        synchronized (mu) {
            state = lostReason != null ? "lost" : ended ? "ended" : "held";
        }
        return "Lock(" + resource + ", token=" + token + ", " + state + ")";
    }

    // -- loss -----------------------------------------------------------------------------

    /** True once the lock is lost (final). */
    public boolean isLost() {
        return lost.isDone();
    }

    /** Why it was lost, or null while it is not. */
    public LostReason lostReason() {
        return lost.getNow(null);
    }

    /** Completed with the reason when the lock is lost; never completed for a lock released in time. */
    public CompletableFuture<LostReason> onLost() {
        return lost.thenApply(r -> r);
    }

    /** Calls {@code listener} once when the lock is lost (at once, on this thread, if it already is). */
    public void addLostListener(Consumer<LostReason> listener) {
        LostReason r;
        synchronized (mu) {
            r = lostReason;
            if (r == null) {
                listeners.add(listener);
                return;
            }
        }
        listener.accept(r);
    }

    /** Throws {@link LockLostException} if the lock is lost: call it between steps of long work. */
    public void checkNotLost() {
        LostReason r;
        String detail;
        synchronized (mu) {
            r = lostReason;
            detail = lostDetail;
        }
        if (r != null) {
            throw new LockLostException("the lock of " + resource + " (token " + token + ") was lost: " + r + ": "
                    + detail);
        }
    }

    // -- renewal --------------------------------------------------------------------------

    /** Under mu: the next wake-up, at the renewal time or the deadline, whichever comes first. */
    private void schedule() {
        if (timer != null) {
            timer.cancel(false);
        }
        long at = inFlight ? deadline : Math.min(nextAt, deadline);
        long delay = Math.max(at - System.nanoTime(), 0);
        timer = LockdClient.SCHEDULER.schedule(tickTask, delay, TimeUnit.NANOSECONDS);
    }

    private void tick() {
        long sent;
        long timeout;
        synchronized (mu) {
            if (ended || lostReason != null) {
                return;
            }
            long now = System.nanoTime();
            if (now - deadline >= 0) {
                loseLocked(LostReason.DEADLINE_PASSED, "no renewal was confirmed before the lease's local deadline");
            } else if (!inFlight && now - nextAt >= 0) {
                inFlight = true;
                sent = now;
                timeout = deadline - now;
                schedule();
                renew(sent, timeout);
                return;
            } else {
                schedule();
                return;
            }
        }
        fireLost();
    }

    private void renew(long sent, long timeout) {
        ListenableFuture<RenewResponse> f;
        try {
            f = client.renewAsync(resource, leaseId, timeout);
        } catch (LockdException e) { // the client is closed
            renewed(sent, null, e);
            return;
        }
        f.addListener(() -> {
            try {
                renewed(sent, f.get(), null);
            } catch (ExecutionException e) {
                var s = Errors.rpc(e.getCause());
                renewed(sent, null, s != null ? Errors.of(s) : new UnavailableException(String.valueOf(e.getCause())));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }, LockdClient.SCHEDULER);
    }

    private void renewed(long sent, RenewResponse ok, LockdException err) {
        synchronized (mu) {
            inFlight = false;
            if (ended || lostReason != null) {
                return;
            }
            long now = System.nanoTime();
            if (now - deadline >= 0) {
                loseLocked(LostReason.DEADLINE_PASSED, "no renewal was confirmed before the lease's local deadline");
            } else if (ok != null) {
                long ttl = ok.getTtlMs() > 0 ? TimeUnit.MILLISECONDS.toNanos(ok.getTtlMs()) : ttlNanos;
                deadline = sent + ttl - safetyMargin(ttl);
                backoff.reset();
                nextAt = sent + Backoff.jittered(ttl / 3);
                schedule();
                return;
            } else if (err instanceof LeaseNotCurrentException) {
                loseLocked(LostReason.NOT_CURRENT, err.getMessage());
            } else if (err instanceof UnavailableException) {
                LOG.log(Level.FINE, "renewal of {0} failed ({1}); retrying until the local deadline",
                        new Object[] {resource, err.getMessage()});
                nextAt = now + backoff.nextDelayNanos();
                schedule();
                return;
            } else {
                loseLocked(LostReason.RENEW_REFUSED, String.valueOf(err.getMessage()));
            }
        }
        fireLost();
    }

    private void loseLocked(LostReason reason, String detail) {
        lostReason = reason;
        lostDetail = detail;
        if (timer != null) {
            timer.cancel(false);
        }
    }

    private void fireLost() {
        List<Consumer<LostReason>> toCall;
        LostReason reason;
        String detail;
        synchronized (mu) {
            reason = lostReason;
            detail = lostDetail;
            toCall = new ArrayList<>(listeners);
            listeners.clear();
        }
        LOG.log(Level.WARNING, "lock of {0} (token {1}) lost: {2} {3}",
                new Object[] {resource, token, reason, detail});
        lost.complete(reason);
        for (Consumer<LostReason> l : toCall) {
            try {
                l.accept(reason);
            } catch (RuntimeException e) {
                LOG.log(Level.WARNING, "a lost listener failed", e);
            }
        }
    }

    /** Stops renewing; false if it had already ended. */
    private boolean stopRenewing() {
        synchronized (mu) {
            if (ended) {
                return false;
            }
            ended = true;
            if (timer != null) {
                timer.cancel(false);
            }
            return true;
        }
    }

    // -- ending ---------------------------------------------------------------------------

    /**
     * Stops renewing and releases (one hold of a reentrant lease). True when this call ended it at
     * lockd; false when it was not current any more, or already released (then without a call).
     */
    public boolean release() {
        if (!stopRenewing()) {
            return false;
        }
        return client.release(resource, leaseId);
    }

    /** {@link #release()}, for try-with-resources. */
    @Override
    public void close() {
        release();
    }

    /**
     * Stops renewing without releasing, and hands the lease over: its id, to renew or release with
     * {@link LockdClient#renew} / {@link LockdClient#release(String, String)}.
     */
    public String detach() {
        stopRenewing();
        return leaseId;
    }

    /**
     * One more hold of this reentrant lease (acquired with an owner): the same lease and token, a
     * Lock of its own that releases that hold. Throws {@link LeaseNotCurrentException} when the
     * lease has ended.
     */
    public Lock reenter() {
        if (owner == null) {
            throw new InvalidArgumentException("the lease of " + resource + " has no owner: acquire it with one to nest it");
        }
        Lock inner;
        try {
            inner = client.acquire(resource, AcquireOptions.builder().ttl(ttl()).owner(owner).build());
        } catch (BusyException e) {
            inner = null;
        }
        if (inner == null || !inner.leaseId.equals(leaseId)) {
            if (inner != null) {
                inner.release();
            }
            throw new LeaseNotCurrentException("the lease of " + resource + " with token " + token + " has ended");
        }
        return inner;
    }
}
