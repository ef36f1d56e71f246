//! The agent's side of the PMIx sidecar: start it for a step, hand its ranks their
//! environment, and carry its fences across nodes.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedSender;

use super::{Aborted, Job, MAX_CONTRIBUTION_PER_RANK, MAX_FRAME};
use crate::pmi::{Exchange, PmiEvent};

/// How long the sidecar may take to register the step and its ranks.
const SETUP_LIMIT: Duration = Duration::from_secs(30);

/// A running sidecar: killed, and its fence relay stopped, when dropped.
#[derive(Debug)]
pub struct Sidecar {
    _child: tokio::process::Child,
    relay: tokio::task::JoinHandle<()>,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.relay.abort();
    }
}

async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "a {len}-byte frame from the PMIx sidecar; at most {MAX_FRAME}"
        )));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some((head[0], payload)))
}

async fn write_frame(
    w: &mut (impl AsyncWriteExt + Unpin),
    kind: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(payload.len() + 5);
    super::write_frame(&mut buf, kind, payload)?;
    w.write_all(&buf).await?;
    w.flush().await
}

/// What the sidecar runs as and in.
pub struct Placement<'a> {
    /// uid, gid, groups (`None`: the agent's own user).
    pub user: Option<(u32, u32, Vec<u32>)>,
    /// The run's cgroups.
    pub cgroups: &'a [std::path::PathBuf],
}

/// Start the sidecar for `job`; the environment of each local rank, in local order.
pub async fn start(
    job: &Job,
    placement: Placement<'_>,
    exchange: Arc<dyn Exchange>,
    events: UnboundedSender<PmiEvent>,
    node: String,
) -> Result<(Sidecar, Vec<Vec<(String, String)>>), String> {
    if !cfg!(feature = "pmix") {
        return Err(
            "spec.launch.mpi is pmix, but this agent was built without PMIx (cargo feature pmix); use pmi2, or OpenMPI's own mpirun".into(),
        );
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the agent's binary: {e}"))?;
    let (mine, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| format!("cannot make the PMIx sidecar's socket: {e}"))?;
    let theirs: OwnedFd = theirs.into();
    let raw = theirs.as_raw_fd();
    let procs = crate::cgroup::procs_files(placement.cgroups)
        .map_err(|e| format!("cannot use the run's cgroups: {e}"))?;
    let user = placement.user.clone();
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("pmix-server")
        .arg("--fd")
        .arg("3")
        .env_clear()
        .env("PATH", crate::runtime::SHIM_PATH)
        .current_dir("/")
        .stdin(std::process::Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec: the socket onto
    // descriptor 3, the run's cgroups, then the drop to the user.
    unsafe {
        cmd.pre_exec(move || {
            crate::runtime::cloexec_inherited();
            if nix::libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            crate::cgroup::join(&procs)?;
            if let Some((uid, gid, groups)) = &user {
                if nix::libc::setgroups(groups.len(), groups.as_ptr()) < 0
                    || nix::libc::setgid(*gid) < 0
                    || nix::libc::setuid(*uid) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the PMIx sidecar: {e}"))?;
    drop(theirs);
    mine.set_nonblocking(true)
        .map_err(|e| format!("the PMIx sidecar's socket: {e}"))?;
    let sock = tokio::net::UnixStream::from_std(mine)
        .map_err(|e| format!("the PMIx sidecar's socket: {e}"))?;
    let (mut rd, mut wr) = sock.into_split();
    let json = serde_json::to_vec(job).map_err(|e| e.to_string())?;
    let setup = async {
        write_frame(&mut wr, b'J', &json)
            .await
            .map_err(|e| format!("cannot reach the PMIx sidecar: {e}"))?;
        match read_frame(&mut rd).await {
            Ok(Some((b'E', b))) => serde_json::from_slice::<Vec<Vec<(String, String)>>>(&b)
                .map_err(|e| format!("the PMIx sidecar's environments: {e}")),
            Ok(Some((b'X', b))) => Err(format!(
                "the PMIx sidecar failed: {}",
                String::from_utf8_lossy(&b)
            )),
            Ok(_) => Err("the PMIx sidecar ended before it registered the ranks".into()),
            Err(e) => Err(format!("the PMIx sidecar: {e}")),
        }
    };
    let envs = tokio::time::timeout(SETUP_LIMIT, setup)
        .await
        .map_err(|_| {
            format!("the PMIx sidecar did not register the ranks within {SETUP_LIMIT:?}")
        })??;
    let local = job.ranks.get(job.node_index as usize).map_or(0, Vec::len);
    if envs.len() != local {
        return Err(format!(
            "the PMIx sidecar gave {} environments for {local} ranks",
            envs.len()
        ));
    }
    let limit = local.max(1).saturating_mul(MAX_CONTRIBUTION_PER_RANK);
    let index = job.node_index as usize;
    let nspace = job.nspace.clone();
    let relay = tokio::spawn(async move {
        let mut round: u64 = 0;
        loop {
            let frame = match read_frame(&mut rd).await {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(step = %nspace, error = %e, "PMIx sidecar");
                    return;
                }
            };
            match frame {
                (b'F', blob) => {
                    let all = if blob.len() > limit {
                        Err(format!(
                            "node {node} contributed {} bytes to a PMIx fence; at most {limit}",
                            blob.len()
                        ))
                    } else {
                        let mut puts = BTreeMap::new();
                        puts.insert(format!("pmix/{index:06}"), hex::encode(&blob));
                        exchange.fence(round, puts).await.and_then(|all| {
                            // Every node's contribution, in node order (the keys sort so).
                            let mut out = Vec::new();
                            for (k, v) in all {
                                if !k.starts_with("pmix/") {
                                    continue;
                                }
                                out.extend(hex::decode(v).map_err(|e| {
                                    format!("a PMIx fence contribution ({k}) is not hex: {e}")
                                })?);
                            }
                            Ok(out)
                        })
                    };
                    round += 1;
                    let sent = match &all {
                        Ok(data) => write_frame(&mut wr, b'R', data).await,
                        Err(e) => {
                            let _ = events.send(PmiEvent::Abort(format!("PMIx fence failed: {e}")));
                            write_frame(&mut wr, b'X', e.as_bytes()).await
                        }
                    };
                    if sent.is_err() {
                        return;
                    }
                }
                (b'A', json) => {
                    let why = match serde_json::from_slice::<Aborted>(&json) {
                        Ok(a) if a.rank != u32::MAX && a.status == i32::MIN => {
                            format!("rank {} on node {node} ended without PMIx finalize", a.rank)
                        }
                        Ok(a) if a.rank != u32::MAX => format!(
                            "rank {} on node {node} called PMIx_Abort (status {}){}",
                            a.rank,
                            a.status,
                            if a.message.is_empty() {
                                String::new()
                            } else {
                                format!(": {}", a.message)
                            }
                        ),
                        _ => format!("a rank on node {node} called PMIx_Abort"),
                    };
                    exchange.abort(&why).await;
                    let _ = events.send(PmiEvent::Abort(why));
                }
                (b'X', text) => {
                    let why = format!(
                        "the PMIx sidecar failed: {}",
                        String::from_utf8_lossy(&text)
                    );
                    let _ = events.send(PmiEvent::Abort(why));
                    return;
                }
                (other, _) => {
                    tracing::warn!(step = %nspace, kind = %(other as char), "unexpected frame from the PMIx sidecar");
                    return;
                }
            }
        }
    });
    Ok((
        Sidecar {
            _child: child,
            relay,
        },
        envs,
    ))
}
