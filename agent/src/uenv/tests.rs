//! Resolving uenvs against a directory repository: lookup, caching, verification, views.

use super::*;

fn repo_with(images: &[(&str, &[u8])]) -> (tempfile::TempDir, Index) {
    let dir = tempfile::tempdir().unwrap();
    let mut index = Index::default();
    for (i, (name, bytes)) in images.iter().enumerate() {
        let file = format!("{name}.squashfs");
        std::fs::write(dir.path().join(&file), bytes).unwrap();
        let mut views = BTreeMap::new();
        views.insert(
            "default".to_string(),
            View {
                prepend: [("PATH".to_string(), format!("/uenv{i}/bin"))].into(),
                set: [("CC".to_string(), "gcc".to_string())].into(),
            },
        );
        index.images.push(IndexEntry {
            name: name.to_string(),
            version: "1.0".into(),
            tag: "v1".into(),
            file,
            sha256: hex::encode(Sha256::digest(bytes)),
            mount: Some(format!("/uenv{i}")),
            views,
            size: Some(bytes.len() as u64),
        });
    }
    std::fs::write(
        dir.path().join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    (dir, index)
}

/// Replace the repository's index.
fn write_index(repo: &Path, index: &Index) {
    std::fs::write(repo.join("index.json"), serde_json::to_vec(index).unwrap()).unwrap();
}

fn allowed() -> Vec<PathBuf> {
    vec![PathBuf::from("/uenv0"), PathBuf::from("/uenv1")]
}

#[tokio::test]
async fn images_are_found_verified_cached_and_viewed() {
    let (repo, _) = repo_with(&[("gnu", b"image one"), ("tools", b"image two")]);
    let cache = tempfile::tempdir().unwrap();
    let r = Repo::Dir(repo.path().to_path_buf());
    let got = resolve(
        &r,
        cache.path(),
        &allowed(),
        "gnu/1.0:v1,tools",
        Some("gnu:default"),
    )
    .await
    .unwrap();
    assert_eq!(got.mounts.len(), 2);
    assert_eq!(got.mounts[0].target, PathBuf::from("/uenv0"));
    assert_eq!(std::fs::read(&got.mounts[1].image).unwrap(), b"image two");
    let mut env = BTreeMap::from([("PATH".to_string(), "/usr/bin".to_string())]);
    apply(&got.env, &mut env);
    assert_eq!(env["PATH"], "/uenv0/bin:/usr/bin");
    assert_eq!(env["CC"], "gcc");
    // Cached: the repository's copy may go; the verified one is used.
    std::fs::remove_file(repo.path().join("gnu.squashfs")).unwrap();
    assert!(resolve(&r, cache.path(), &allowed(), "gnu", None)
        .await
        .is_ok());
}

#[tokio::test]
async fn what_the_repository_lacks_or_corrupts_is_refused_by_name() {
    let (repo, mut index) = repo_with(&[("gnu", b"image one")]);
    let cache = tempfile::tempdir().unwrap();
    let r = Repo::Dir(repo.path().to_path_buf());
    let e = resolve(&r, cache.path(), &allowed(), "nvhpc/24.1", None)
        .await
        .unwrap_err();
    assert!(e.permanent);
    let e = e.message;
    assert!(
        e.contains("uenv nvhpc/24.1 is not in") && e.contains("gnu/1.0:v1"),
        "{e}"
    );
    let e = resolve(&r, cache.path(), &allowed(), "gnu", Some("spack"))
        .await
        .unwrap_err();
    assert!(e.permanent);
    let e = e.message;
    assert!(
        e.contains("view \"spack\"") && e.contains("gnu:default"),
        "{e}"
    );
    // A file that does not match the index's SHA-256 is not used (nor kept).
    index.images[0].sha256 = hex::encode(Sha256::digest(b"something else"));
    write_index(repo.path(), &index);
    let e = resolve(&r, cache.path(), &allowed(), "gnu", None)
        .await
        .unwrap_err();
    assert!(!e.permanent, "a bad copy may be fixed: {e}");
    assert!(
        e.message.contains("SHA-256 is") && e.message.contains("not used"),
        "{e}"
    );
    let left: Vec<String> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.iter().all(|f| !f.contains(".part-")), "{left:?}");
    // A mount point the site wrote wrong.
    index.images[0].sha256 = hex::encode(Sha256::digest(b"image one"));
    for bad in ["/opt/../etc", "/etc", "/uenv0/../etc"] {
        index.images[0].mount = Some(bad.into());
        write_index(repo.path(), &index);
        let e = resolve(&r, cache.path(), &allowed(), "gnu", None)
            .await
            .unwrap_err();
        assert!(
            e.permanent && e.message.contains("not one this node mounts"),
            "{e}"
        );
    }
    // A file outside the repository.
    index.images[0].mount = None;
    index.images[0].file = "../../etc/shadow".into();
    write_index(repo.path(), &index);
    let e = resolve(
        &r,
        cache.path(),
        &[PathBuf::from(DEFAULT_MOUNT)],
        "gnu",
        None,
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("inside the repository"), "{e}");
    // Plain HTTP from elsewhere: refused; from this machine: fine.
    assert!(Repo::from_flag("http://uenv.example.org/repo").is_err());
    assert!(Repo::from_flag("http://127.0.0.1:8080/repo").is_ok());
    assert!(Repo::from_flag("https://uenv.example.org/repo").is_ok());
}

#[test]
fn mount_points_are_reached_without_links_and_owned_by_root() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
    assert!(mount::tests_open(&real).is_ok());
    let e = mount::tests_open(&dir.path().join("link")).unwrap_err();
    assert!(e.contains("without a link"), "{e}");
    // Writable by others: refused.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = mount::tests_open(&real).unwrap_err();
    assert!(e.contains("owned by root"), "{e}");
}
