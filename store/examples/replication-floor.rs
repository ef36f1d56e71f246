//! `replication-floor`: the floor under a 3-member replicated put built from the parts
//! Lattice's store uses, without openraft, so `hack/bench-replication-floor.sh` can say how
//! much a replication path of our own could gain.
//!
//! The parts are the same: the etcd port on tonic, one `AppendStream` (tonic) to each
//! follower, a record written and `fdatasync`ed on every member, the leader's own write on
//! a writer thread in parallel with the followers', and one-worker tokio runtimes. What is
//! left out is everything a real store needs besides: no Raft state (terms, votes, log
//! matching), no commit index sent to the followers, no apply on them, and on the leader
//! only a map insert. The leader answers a put once its own record and one follower's are
//! durable (a majority of three). Only `Put` and a serializable `Range` (the client's
//! no-op round trip) are served.
//!
//! ```text
//! replication-floor follower <listen addr> <data dir>
//! replication-floor leader <etcd addr> <data dir> <follower addr>,<follower addr>
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use etcd_client::proto::*;
use futures::Stream;
use lattice_store::raft::pb::raft_transport_client::RaftTransportClient;
use lattice_store::raft::pb::raft_transport_server::{RaftTransport, RaftTransportServer};
use lattice_store::raft::pb::Payload;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};

/// Space the log reserves (written with zeros first) and wraps around in.
const LOG_BYTES: u64 = 64 << 20;

/// A log file: records go one after the other into reserved space, each `fdatasync`ed.
struct Log {
    file: std::fs::File,
    offset: u64,
}

impl Log {
    fn create(dir: &str) -> anyhow::Result<Log> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {dir}"))?;
        let path = format!("{dir}/floor.log");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .with_context(|| format!("opening {path}"))?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..LOG_BYTES >> 20 {
            file.write_all(&zeros)?;
        }
        file.sync_all()?;
        Ok(Log { file, offset: 0 })
    }

    fn append(&mut self, record: &[u8]) -> std::io::Result<()> {
        if self.offset + record.len() as u64 > LOG_BYTES {
            self.offset = 0;
        }
        self.file.write_all_at(record, self.offset)?;
        self.offset += record.len() as u64;
        self.file.sync_data()
    }
}

fn io_status(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

fn unimplemented<T>() -> Result<T, Status> {
    Err(Status::unimplemented("not part of the replication floor"))
}

/// A follower: makes each record it receives durable, then answers.
struct Follower(Arc<Mutex<Log>>);

type PayloadStream = Pin<Box<dyn Stream<Item = Result<Payload, Status>> + Send>>;

#[tonic::async_trait]
impl RaftTransport for Follower {
    async fn append_entries(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
        unimplemented()
    }

    type AppendStreamStream = PayloadStream;

    async fn append_stream(
        &self,
        request: Request<tonic::Streaming<Payload>>,
    ) -> Result<Response<PayloadStream>, Status> {
        let state = (request.into_inner(), self.0.clone());
        let answers = futures::stream::unfold(state, |(mut inbound, log)| async move {
            let record = match inbound.message().await {
                Ok(Some(p)) => p.data,
                Ok(None) | Err(_) => return None,
            };
            let written = match log.lock() {
                Ok(mut log) => log.append(&record).map_err(io_status),
                Err(_) => Err(Status::internal("log lock poisoned")),
            };
            Some((written.map(|()| Payload { data: vec![1] }), (inbound, log)))
        });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn vote(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
        unimplemented()
    }

    async fn install_snapshot(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
        unimplemented()
    }

    async fn forward(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
        unimplemented()
    }

    type ForwardStreamStream = PayloadStream;

    async fn forward_stream(
        &self,
        _: Request<tonic::Streaming<Payload>>,
    ) -> Result<Response<PayloadStream>, Status> {
        unimplemented()
    }
}

type Done = tokio::sync::oneshot::Sender<()>;

/// The leader: its own log writer thread, one replication task per follower.
struct Leader {
    writer: std::sync::mpsc::Sender<(Vec<u8>, Done)>,
    followers: Vec<tokio::sync::mpsc::UnboundedSender<(Vec<u8>, Done)>>,
    revision: AtomicI64,
    kv: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
}

fn header(revision: i64) -> Option<PbResponseHeader> {
    Some(PbResponseHeader {
        cluster_id: 1,
        member_id: 1,
        revision,
        raft_term: 1,
    })
}

type RangeStream = Pin<Box<dyn Stream<Item = Result<PbRangeStreamResponse, Status>> + Send>>;

#[tonic::async_trait]
impl PbKvService for Leader {
    async fn range(&self, _: Request<PbRangeRequest>) -> Result<Response<PbRangeResponse>, Status> {
        Ok(Response::new(PbRangeResponse {
            header: header(self.revision.load(Ordering::SeqCst)),
            ..Default::default()
        }))
    }

    type RangeStreamStream = RangeStream;

    async fn range_stream(
        &self,
        _: Request<PbRangeRequest>,
    ) -> Result<Response<RangeStream>, Status> {
        unimplemented()
    }

    async fn put(&self, request: Request<PbPutRequest>) -> Result<Response<PbPutResponse>, Status> {
        let put = request.into_inner();
        let mut record = Vec::with_capacity(put.key.len() + put.value.len() + 4);
        record.extend_from_slice(&(put.key.len() as u32).to_le_bytes());
        record.extend_from_slice(&put.key);
        record.extend_from_slice(&put.value);
        let (own_tx, own) = tokio::sync::oneshot::channel();
        self.writer
            .send((record.clone(), own_tx))
            .map_err(|_| Status::internal("log writer gone"))?;
        let mut acks = Vec::with_capacity(self.followers.len());
        for follower in &self.followers {
            let (tx, rx) = tokio::sync::oneshot::channel();
            follower
                .send((record.clone(), tx))
                .map_err(|_| Status::internal("replication task gone"))?;
            acks.push(rx);
        }
        // A majority of three: this member's record and either follower's.
        let (own, follower) = tokio::join!(own, futures::future::select_ok(acks));
        if own.is_err() || follower.is_err() {
            return Err(Status::internal("a write failed"));
        }
        let revision = self.revision.fetch_add(1, Ordering::SeqCst) + 1;
        self.kv
            .lock()
            .map_err(|_| Status::internal("map lock poisoned"))?
            .insert(put.key, put.value);
        Ok(Response::new(PbPutResponse {
            header: header(revision),
            prev_kv: None,
        }))
    }

    async fn delete_range(
        &self,
        _: Request<PbDeleteRequest>,
    ) -> Result<Response<PbDeleteResponse>, Status> {
        unimplemented()
    }

    async fn txn(&self, _: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        unimplemented()
    }

    async fn compact(
        &self,
        _: Request<PbCompactionRequest>,
    ) -> Result<Response<PbCompactionResponse>, Status> {
        unimplemented()
    }
}

/// A task that sends each record to one follower and reports its answer.
async fn replicate_to(
    addr: &str,
) -> anyhow::Result<tokio::sync::mpsc::UnboundedSender<(Vec<u8>, Done)>> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Payload>(1);
    let mut answers = RaftTransportClient::new(channel)
        .append_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let (records, mut queue) = tokio::sync::mpsc::unbounded_channel::<(Vec<u8>, Done)>();
    tokio::spawn(async move {
        while let Some((data, done)) = queue.recv().await {
            if tx.send(Payload { data }).await.is_err() {
                return;
            }
            match answers.message().await {
                Ok(Some(_)) => {
                    let _ = done.send(());
                }
                Ok(None) | Err(_) => return,
            }
        }
    });
    Ok(records)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| {
        args.get(i)
            .cloned()
            .context("usage: replication-floor follower <addr> <dir> | leader <etcd addr> <dir> <follower>,<follower>")
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(arg(2)?).await?;
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        match arg(1)?.as_str() {
            "follower" => {
                let log = Arc::new(Mutex::new(Log::create(&arg(3)?)?));
                Server::builder()
                    .add_service(RaftTransportServer::new(Follower(log)))
                    .serve_with_incoming(incoming)
                    .await?;
            }
            "leader" => {
                let mut log = Log::create(&arg(3)?)?;
                let (writer, queue) = std::sync::mpsc::channel::<(Vec<u8>, Done)>();
                std::thread::Builder::new()
                    .name("floor-log-writer".into())
                    .spawn(move || {
                        while let Ok((record, done)) = queue.recv() {
                            if log.append(&record).is_ok() {
                                let _ = done.send(());
                            }
                        }
                    })?;
                let mut followers = Vec::new();
                for addr in arg(4)?.split(',') {
                    followers.push(replicate_to(addr).await?);
                }
                let leader = Leader {
                    writer,
                    followers,
                    revision: AtomicI64::new(1),
                    kv: Mutex::new(BTreeMap::new()),
                };
                Server::builder()
                    .add_service(PbKvServer::new(leader))
                    .serve_with_incoming(incoming)
                    .await?;
            }
            other => anyhow::bail!("unknown role {other:?}: follower or leader"),
        }
        Ok(())
    })
}
