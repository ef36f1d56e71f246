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
use std::future::Future;
use std::pin::Pin;

/// How long the sidecar may take to register the step and its ranks.
const SETUP_LIMIT: Duration = Duration::from_secs(30);

/// The most a handshake's environments may take.
const MAX_ENVIRONMENTS: usize = 16 << 20;
/// The most an abort or error frame may take (its text is cut to 1 KiB after).
const MAX_TEXT: usize = 4 << 10;
/// The most one node may contribute to one fence (hex-encoded twice its size in the
/// exchange, whose messages are at most 64 MiB).
const MAX_CONTRIBUTION: usize = 16 << 20;

/// How long a sidecar may have been gone before the step is stopped for it.
const SIDECAR_GONE_GRACE: Duration = Duration::from_secs(5);

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

/// Read one frame whose payload may have at most `limit(kind)` bytes (checked before
/// anything is allocated).
async fn read_frame(
    r: &mut (impl AsyncReadExt + Unpin),
    limit: impl Fn(u8) -> usize,
) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let most = limit(head[0]).min(MAX_FRAME);
    if len > most {
        return Err(std::io::Error::other(format!(
            "a {len}-byte {:?} frame from the PMIx sidecar; at most {most}",
            head[0] as char
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
            // dup2 onto itself keeps the close-on-exec flag just set: cleared by hand.
            let rc = if raw == 3 {
                nix::libc::fcntl(3, nix::libc::F_SETFD, 0)
            } else {
                nix::libc::dup2(raw, 3)
            };
            if rc < 0 {
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
        match read_frame(&mut rd, |k| {
            if k == b'E' {
                MAX_ENVIRONMENTS
            } else {
                MAX_TEXT
            }
        })
        .await
        {
            Ok(Some((b'E', b))) => serde_json::from_slice::<Vec<Vec<(String, String)>>>(&b)
                .map_err(|e| format!("the PMIx sidecar's environments: {e}")),
            Ok(Some((b'X', b))) => Err(format!(
                "the PMIx sidecar failed: {}",
                crate::pmi::tidy(&String::from_utf8_lossy(&b))
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
    let limit = local
        .max(1)
        .saturating_mul(MAX_CONTRIBUTION_PER_RANK)
        .min(MAX_CONTRIBUTION);
    let relay = tokio::spawn(relay(Relay {
        rd,
        wr,
        exchange,
        events,
        node,
        index: job.node_index as usize,
        nodes: job.nodes.len(),
        nspace: job.nspace.clone(),
        limit,
    }));
    Ok((
        Sidecar {
            _child: child,
            relay,
        },
        envs,
    ))
}

/// What the relay between a sidecar and the step's exchange holds.
struct Relay {
    rd: tokio::net::unix::OwnedReadHalf,
    wr: tokio::net::unix::OwnedWriteHalf,
    exchange: Arc<dyn Exchange>,
    events: UnboundedSender<PmiEvent>,
    node: String,
    index: usize,
    nodes: usize,
    nspace: String,
    limit: usize,
}

type FenceResult = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>;

/// Every node's contribution from an exchange's answer: exactly the keys `pmix/000000`
/// to `pmix/<nodes-1>`, in node order.
fn gather(all: &BTreeMap<String, String>, nodes: usize) -> Result<Vec<u8>, String> {
    if all.len() != nodes {
        return Err(format!(
            "a PMIx fence came back with {} contributions for {nodes} nodes",
            all.len()
        ));
    }
    let mut out = Vec::new();
    for i in 0..nodes {
        let k = format!("pmix/{i:06}");
        let v = all
            .get(&k)
            .ok_or_else(|| format!("a PMIx fence came back without node {i}'s contribution"))?;
        out.extend(
            hex::decode(v)
                .map_err(|e| format!("node {i}'s PMIx fence contribution is not hex: {e}"))?,
        );
    }
    Ok(out)
}

/// Carry the sidecar's fences to the exchange and its aborts to the supervisor, until the
/// step ends (this task is aborted) or the sidecar goes away, which ends the step too.
async fn relay(r: Relay) {
    let Relay {
        mut rd,
        mut wr,
        exchange,
        events,
        node,
        index,
        nodes,
        nspace,
        limit,
    } = r;
    // Frames are read by a task of their own: a read cut off half-way would lose the
    // stream's framing.
    let (tx, mut frames) = tokio::sync::mpsc::channel::<std::io::Result<(u8, Vec<u8>)>>(4);
    let reader = tokio::spawn(async move {
        loop {
            let f = read_frame(&mut rd, |k| if k == b'F' { limit } else { MAX_TEXT }).await;
            let end = !matches!(f, Ok(Some(_)));
            let item = match f {
                Ok(Some(x)) => Ok(x),
                Ok(None) => Err(std::io::Error::other("the PMIx sidecar ended")),
                Err(e) => Err(e),
            };
            if tx.send(item).await.is_err() || end {
                return;
            }
        }
    });
    let _reader = AbortOnDrop(reader);
    let mut round: u64 = 0;
    let mut fence: Option<FenceResult> = None;
    let mut aborted = false;
    let stop = |why: String| {
        let _ = events.send(PmiEvent::Abort(why));
    };
    loop {
        tokio::select! {
            done = async { fence.as_mut().expect("guarded").await }, if fence.is_some() => {
                fence = None;
                let sent = match &done {
                    Ok(data) => write_frame(&mut wr, b'R', data).await,
                    Err(e) => {
                        stop(format!("PMIx fence failed: {e}"));
                        write_frame(&mut wr, b'X', e.as_bytes()).await
                    }
                };
                if sent.is_err() {
                    if !aborted {
                        stop(format!("the PMIx sidecar of node {node} went away"));
                    }
                    return;
                }
            }
            frame = frames.recv() => {
                let (kind, data) = match frame {
                    Some(Ok(f)) => f,
                    Some(Err(e)) => {
                        if !aborted {
                            // The run's end takes the sidecar with it (it lives in the
                            // run's cgroups) and then stops this relay: only a sidecar
                            // that died while the ranks run is still here after a while.
                            tokio::time::sleep(SIDECAR_GONE_GRACE).await;
                            tracing::warn!(step = %nspace, error = %e, "PMIx sidecar");
                            stop(format!("the PMIx sidecar of node {node} went away: {e}"));
                        }
                        return;
                    }
                    None => return,
                };
                match kind {
                    b'F' if fence.is_none() => {
                        let mut puts = BTreeMap::new();
                        puts.insert(format!("pmix/{index:06}"), hex::encode(&data));
                        let ex = exchange.clone();
                        let r = round;
                        round += 1;
                        fence = Some(Box::pin(async move {
                            let all = ex.fence(r, puts).await?;
                            gather(&all, nodes)
                        }));
                    }
                    b'F' => {
                        stop(format!("the PMIx sidecar of node {node} started a fence before the last one ended"));
                        return;
                    }
                    b'A' if !aborted => {
                        aborted = true;
                        let why = match serde_json::from_slice::<Aborted>(&data) {
                            Ok(a) if a.rank != u32::MAX && a.lost => format!(
                                "rank {} on node {node} ended without PMIx finalize",
                                a.rank
                            ),
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
                        let why = crate::pmi::tidy(&why);
                        exchange.abort(&why).await;
                        stop(why);
                    }
                    // Later aborts of the same step change nothing.
                    b'A' => {}
                    b'X' => {
                        if !aborted {
                            stop(crate::pmi::tidy(&format!(
                                "the PMIx sidecar of node {node} failed: {}",
                                String::from_utf8_lossy(&data)
                            )));
                        }
                        return;
                    }
                    other => {
                        stop(format!(
                            "the PMIx sidecar of node {node} sent an unknown frame {:?}",
                            other as char
                        ));
                        return;
                    }
                }
            }
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_takes_exactly_one_contribution_per_node_in_order() {
        let mut all = BTreeMap::new();
        all.insert("pmix/000001".to_string(), hex::encode(b"b"));
        all.insert("pmix/000000".to_string(), hex::encode(b"a"));
        assert_eq!(gather(&all, 2).unwrap(), b"ab");
        // A peer that adds a key, or leaves one out, is refused.
        let mut extra = all.clone();
        extra.insert("pmix/000002".into(), hex::encode(b"c"));
        assert!(gather(&extra, 2).is_err());
        let mut renamed = all.clone();
        renamed.remove("pmix/000001");
        renamed.insert("pmix/1".into(), hex::encode(b"b"));
        assert!(gather(&renamed, 2).is_err());
        let mut bad = all;
        bad.insert("pmix/000001".into(), "zz".into());
        assert!(gather(&bad, 2).is_err());
    }
}
