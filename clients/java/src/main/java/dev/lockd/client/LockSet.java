package dev.lockd.client;

import java.util.Iterator;
import java.util.List;

/** Several held locks ({@link LockdClient#acquireAll}, {@link LockdClient#acquireOrdered}); closing releases them all. */
public final class LockSet implements AutoCloseable, Iterable<Lock> {
    private final List<Lock> locks;

    LockSet(List<Lock> locks) {
        this.locks = List.copyOf(locks);
    }

    /** The locks, in the order granted. */
    public List<Lock> locks() {
        return locks;
    }

    public Lock get(int i) {
        return locks.get(i);
    }

    public int size() {
        return locks.size();
    }

    @Override
    public Iterator<Lock> iterator() {
        return locks.iterator();
    }

    /** True when any lock of the set is lost. */
    public boolean isLost() {
        return locks.stream().anyMatch(Lock::isLost);
    }

    /** Throws {@link LockLostException} when any lock of the set is lost. */
    public void checkNotLost() {
        locks.forEach(Lock::checkNotLost);
    }

    /** Releases every lock, last first; true when each ended at lockd. Tries each even if one fails. */
    public boolean release() {
        boolean all = true;
        LockdException first = null;
        for (int i = locks.size() - 1; i >= 0; i--) {
            try {
                all &= locks.get(i).release();
            } catch (LockdException e) {
                if (first == null) {
                    first = e;
                }
            }
        }
        if (first != null) {
            throw first;
        }
        return all;
    }

    @Override
    public void close() {
        release();
    }
}
