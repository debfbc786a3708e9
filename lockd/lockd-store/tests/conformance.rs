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

    struct Redb(tempfile::TempDir);

    impl Harness for Redb {
        type S = RedbStore;
        fn open(&mut self) -> RedbStore {
            RedbStore::open(self.0.path(), &RedbStoreOptions::default()).expect("open redb store")
        }
        fn crash(&mut self, store: RedbStore) {
            store.abandon();
        }
    }

    lockd_store::conformance_tests!(Redb(tempfile::tempdir().expect("temp dir")));

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
