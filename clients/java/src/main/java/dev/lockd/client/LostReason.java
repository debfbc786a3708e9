package dev.lockd.client;

/** Why a lock was lost. */
public enum LostReason {
    /** No renewal was confirmed before the lease's local deadline (lockd unreachable or slow). */
    DEADLINE_PASSED,
    /** lockd said the lease is not current any more. */
    NOT_CURRENT,
    /** A renewal was refused for another reason. */
    RENEW_REFUSED
}
