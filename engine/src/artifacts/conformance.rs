//! The suite every artifact store passes (`memory://`, `file://`, S3), for the tests of
//! this crate and of the backends'.

use std::path::PathBuf;

use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use super::{ArtifactError, ArtifactStore, AttemptKey};

fn attempt(n: u32) -> AttemptKey {
    AttemptKey::of_stage("r1", "s", n)
}

fn scratch(store: &ArtifactStore) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "dt-art-{}-{}-{}",
        std::process::id(),
        store.url.len(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every check, on an empty store.
pub async fn check(store: &ArtifactStore) {
    publishes_and_materializes(store).await;
    large_objects_round_trip(store).await;
    modified_objects_are_detected(store).await;
    one_conditional_create_wins(store).await;
}

/// Manifests list what was published, in path order; a second attempt of the same
/// output is a separate, equal artifact.
pub async fn publishes_and_materializes(store: &ArtifactStore) {
    let tmp = scratch(store);
    let out = tmp.join("out");
    std::fs::create_dir_all(out.join("sub")).unwrap();
    std::fs::write(out.join("a.txt"), b"hello").unwrap();
    std::fs::write(out.join("sub/b.bin"), vec![7u8; 1000]).unwrap();
    let art = store.publish_dir(&attempt(1), "data", &out).await.unwrap();
    assert!(art.digest.starts_with("sha256:"));
    let m = store.manifest(&art).await.unwrap();
    assert_eq!(
        m.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        ["a.txt", "sub/b.bin"]
    );
    assert_eq!(m.size, 1005);
    let dest = tmp.join("in");
    store.materialize(&art, &dest).await.unwrap();
    assert_eq!(std::fs::read(dest.join("a.txt")).unwrap(), b"hello");
    assert_eq!(std::fs::read(dest.join("sub/b.bin")).unwrap().len(), 1000);
    store.verify(&art).await.unwrap();
    let keys = store.list("runs/r1/s/1").await.unwrap();
    assert_eq!(
        keys,
        [
            "runs/r1/s/1/data/a.txt",
            "runs/r1/s/1/data/sub/b.bin",
            "runs/r1/s/1/manifests/data.json"
        ]
    );
    let again = store.publish_dir(&attempt(2), "data", &out).await.unwrap();
    assert_eq!(store.manifest(&again).await.unwrap().files.len(), 2);
    assert_ne!(again.manifest, art.manifest);
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// A file of several parts goes up in a multipart upload and comes back in ranges,
/// byte for byte.
pub async fn large_objects_round_trip(store: &ArtifactStore) {
    let tmp = scratch(store);
    let out = tmp.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let size = 2 * store.transfer.part + 12_345;
    let bytes: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(out.join("big.bin"), &bytes).unwrap();
    let art = store.publish_dir(&attempt(3), "big", &out).await.unwrap();
    let m = store.manifest(&art).await.unwrap();
    assert_eq!(m.size, size as u64);
    store.verify(&art).await.unwrap();
    let dest = tmp.join("in");
    store.materialize(&art, &dest).await.unwrap();
    assert!(std::fs::read(dest.join("big.bin")).unwrap() == bytes);
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// An object overwritten behind the engine's back is refused, by `verify` and by
/// `materialize`.
pub async fn modified_objects_are_detected(store: &ArtifactStore) {
    if store.local_root.is_some() {
        return; // published files are read-only hard links; tested on their own
    }
    let tmp = scratch(store);
    let out = tmp.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("a.txt"), b"hello").unwrap();
    let art = store.publish_dir(&attempt(4), "data", &out).await.unwrap();
    store
        .store
        .put(
            &Path::from("runs/r1/s/4/data/a.txt"),
            PutPayload::from_static(b"HELLO, tampered"),
        )
        .await
        .unwrap();
    let err = store.verify(&art).await.unwrap_err();
    assert!(matches!(err, ArtifactError::Modified { .. }), "{err}");
    let err = store.materialize(&art, &tmp.join("in")).await.unwrap_err();
    assert!(matches!(err, ArtifactError::Modified { .. }), "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Sixteen writers put `key` at once, writer `i` the bytes `{label}{i}` with the options
/// `mode(i)` gives it: the indices of those that succeeded (a lost race is `loss`).
async fn race(
    store: &ArtifactStore,
    key: &Path,
    label: &'static str,
    mode: impl Fn(usize) -> object_store::PutMode,
    loss: fn(&object_store::Error) -> bool,
) -> Vec<usize> {
    let races = (0..16).map(|i| {
        let (store, key) = (store.store.clone(), key.clone());
        let opts = object_store::PutOptions {
            mode: mode(i),
            ..Default::default()
        };
        tokio::spawn(async move {
            let r = store
                .put_opts(&key, PutPayload::from(format!("{label}{i}")), opts)
                .await;
            (i, r)
        })
    });
    futures::future::join_all(races)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .filter_map(|(i, r)| match r {
            Ok(_) => Some(i),
            Err(e) if loss(&e) => None,
            Err(e) => panic!("writer {i}: {e}"),
        })
        .collect()
}

/// Sixteen writers race to create one key (how versions and alias generations are
/// claimed), then to update it from the same version: exactly one wins each race.
pub async fn one_conditional_create_wins(store: &ArtifactStore) {
    use object_store::{PutMode, UpdateVersion};
    let key = Path::from("registry/race/aliases/production/1.json");
    let winners = race(
        store,
        &key,
        "c",
        |_| PutMode::Create,
        |e| matches!(e, object_store::Error::AlreadyExists { .. }),
    )
    .await;
    assert_eq!(winners.len(), 1, "winners of the create race: {winners:?}");
    let stored = store.store.get(&key).await.unwrap();
    let version = UpdateVersion {
        e_tag: stored.meta.e_tag.clone(),
        version: stored.meta.version.clone(),
    };
    assert_eq!(
        stored.bytes().await.unwrap().as_ref(),
        format!("c{}", winners[0]).as_bytes()
    );
    if store.local_root.is_some() {
        return; // the local file system has no compare-and-swap on ETags
    }
    // Other bytes than the create race's: an ETag is the content's, so a writer putting
    // the same bytes again would leave the version unchanged for the next.
    let winners = race(
        store,
        &key,
        "u",
        |_| PutMode::Update(version.clone()),
        |e| matches!(e, object_store::Error::Precondition { .. }),
    )
    .await;
    assert_eq!(winners.len(), 1, "winners of the update race: {winners:?}");
    let now = store.store.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(now.as_ref(), format!("u{}", winners[0]).as_bytes());
}
