//! The store conformance suite, run by both stores; plus what is particular to redb.

mod memory {
    use lockd_store::MemoryStore;
    use lockd_store::conformance::Harness;

    struct Mem(MemoryStore);

    impl Harness for Mem {
        type S = MemoryStore;
        fn open(&mut self) -> MemoryStore {
            self.0.reopen()
        }
        fn crash(&mut self, store: MemoryStore) {
            store.crash();
        }
    }

    lockd_store::conformance_tests!(Mem(MemoryStore::new()));
}

mod redb {
    use lockd_store::conformance::Harness;
    use lockd_store::{RedbStore, RedbStoreOptions};

    struct Redb(tempfile::TempDir, RedbStoreOptions);

    /// A small journal, so that the suite's histories wrap it many times (checkpoints).
    fn options() -> RedbStoreOptions {
        RedbStoreOptions {
            journal_bytes: 16 << 10,
            ..RedbStoreOptions::default()
        }
    }

    impl Harness for Redb {
        type S = RedbStore;
        fn open(&mut self) -> RedbStore {
            RedbStore::open(self.0.path(), &self.1).expect("open redb store")
        }
        fn crash(&mut self, store: RedbStore) {
            store.abandon();
        }
    }

    lockd_store::conformance_tests!(Redb(tempfile::tempdir().expect("temp dir"), options()));

    /// A checkpoint every three ops: the suite's checks then meet state that is partly in redb
    /// and partly only journaled (a lease granted in redb and removed since, a request id
    /// remembered in redb and forgotten since, the high-water in either).
    mod frequent_checkpoints {
        use super::*;

        lockd_store::conformance_tests!(Redb(
            tempfile::tempdir().expect("temp dir"),
            RedbStoreOptions {
                checkpoint_ops: 3,
                ..options()
            }
        ));
    }

    /// Records journaled but never applied to redb (the process died right after the sync) are
    /// replayed on open.
    #[test]
    fn journaled_batches_are_replayed_after_a_crash() {
        use fencing::FencingToken;
        use lockd_store::Store;
        use lockd_store::conformance::{sample_grant, sample_remove};
        let dir = tempfile::tempdir().unwrap();
        let mut s = RedbStore::open(dir.path(), &options()).unwrap();
        for n in 1..=200 {
            s.commit(&[sample_grant(n)], true).unwrap();
        }
        s.commit(&[sample_remove(7)], true).unwrap();
        // No tidy, no checkpoint: the last batches exist only in the journal.
        s.abandon();
        let mut s = RedbStore::open(dir.path(), &options()).unwrap();
        let snap = s.load().unwrap();
        assert_eq!(snap.last_token, FencingToken::new(200));
        assert_eq!(snap.leases.len(), 199);
        assert!(snap.leases.iter().all(|l| l.token.get() != 7));
    }

    #[test]
    fn a_second_open_of_the_same_directory_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let _first = RedbStore::open(dir.path(), &RedbStoreOptions::default()).unwrap();
        let second = RedbStore::open(dir.path(), &RedbStoreOptions::default());
        let msg = second.err().expect("second open must fail").to_string();
        assert!(msg.contains("in use by another lockd"), "{msg}");
    }

    #[test]
    fn a_data_file_that_is_not_redb_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("lockd.redb"),
            b"this is not a database, just text",
        )
        .unwrap();
        assert!(RedbStore::open(dir.path(), &RedbStoreOptions::default()).is_err());
    }
}
