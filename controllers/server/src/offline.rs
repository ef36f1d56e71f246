//! Offline maintenance of the embedded store: backup, verify, restore.

use std::path::Path;

use anyhow::Context;
use lattice_store::{Backup, EmbeddedStore, StoreConfig};

pub async fn backup_create(data_dir: &Path, file: &Path) -> anyhow::Result<()> {
    let store = EmbeddedStore::open(data_dir.join("store"), StoreConfig::default())
        .await
        .with_context(|| {
            format!(
                "opening {} (is a server still running on it?)",
                data_dir.display()
            )
        })?;
    let backup = store.backup(file).await?;
    store.close().await;
    println!(
        "backup written to {}: revision {}, {} keys, {} leases",
        file.display(),
        backup.revision,
        backup.key_count(),
        backup.leases.len()
    );
    Ok(())
}

pub fn backup_verify(file: &Path) -> anyhow::Result<()> {
    let backup = Backup::read(file)?;
    println!(
        "{}: OK (checksum verified): revision {}, {} keys, {} leases",
        file.display(),
        backup.revision,
        backup.key_count(),
        backup.leases.len()
    );
    Ok(())
}

pub fn restore(data_dir: &Path, file: &Path) -> anyhow::Result<()> {
    let backup = Backup::read(file)?;
    backup.restore_into(&data_dir.join("store"))?;
    println!(
        "restored revision {} ({} keys) into {}; start the server with --data-dir {}",
        backup.revision,
        backup.key_count(),
        data_dir.display(),
        data_dir.display()
    );
    Ok(())
}
