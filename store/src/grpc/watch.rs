//! The Watch service: one bidirectional stream carries many watchers.
//!
//! Each watcher is a task that forwards its backend [`crate::WatchStream`] into the shared
//! response channel, tagged with its watch ID. The session task reads create, cancel and
//! progress requests. Responses follow etcd 3.4/3.5:
//! * create → `created=true` (then `canceled=true` with `compact_revision` when the start
//!   revision was compacted, or with `cancel_reason` on any other error);
//! * cancel → `canceled=true`; an unknown ID gets no answer;
//! * progress request → a response with `watch_id = -1`, no events, and a header revision
//!   below which every event has already been sent on this stream.

use std::collections::HashMap;
use std::sync::Arc;

use etcd_client::proto::{PbWatchRequest, PbWatchRequestUnion, PbWatchResponse, PbWatchService};
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status, Streaming};

use super::convert::event_to_pb;
use super::services::{BoxStream, Shared};
use crate::backend::WatchStream;
use crate::error::{StoreError, StoreResult};
use crate::types::{KeyRange, WatchBatch, WatchFilters, WatchRequest};

/// etcd's `clientv3.InvalidWatchID`: progress responses that belong to no watcher.
const INVALID_WATCH_ID: i64 = -1;
const FILTER_NOPUT: i32 = 0;
const FILTER_NODELETE: i32 = 1;
/// Responses buffered per stream before watchers wait for the client.
const OUTBOUND_BUFFER: usize = 1024;

type Outbound = mpsc::Sender<Result<PbWatchResponse, Status>>;

pub(crate) struct WatchSvc(pub Arc<Shared>);

#[tonic::async_trait]
impl PbWatchService for WatchSvc {
    type WatchStream = BoxStream<PbWatchResponse>;

    async fn watch(
        &self,
        request: Request<Streaming<PbWatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(OUTBOUND_BUFFER);
        let session = Session {
            shared: self.0.clone(),
            out: tx,
            watchers: HashMap::new(),
        };
        tokio::spawn(session.run(inbound));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

struct Watcher {
    task: JoinHandle<()>,
    /// Asks the watcher to flush every event its stream has ready, then answer.
    flush: mpsc::Sender<oneshot::Sender<()>>,
}

struct Session {
    shared: Arc<Shared>,
    out: Outbound,
    watchers: HashMap<i64, Watcher>,
}

impl Drop for Session {
    fn drop(&mut self) {
        for (_, w) in self.watchers.drain() {
            w.task.abort();
        }
    }
}

impl Session {
    async fn run(mut self, mut inbound: Streaming<PbWatchRequest>) {
        loop {
            let msg = tokio::select! {
                m = inbound.next() => m,
                _ = self.out.closed() => break,
            };
            let req = match msg {
                None => break,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "watch stream ended by client");
                    break;
                }
                Some(Ok(r)) => r,
            };
            let ok = match req.request_union {
                Some(PbWatchRequestUnion::CreateRequest(c)) => {
                    let filters = WatchFilters {
                        no_put: c.filters.contains(&FILTER_NOPUT),
                        no_delete: c.filters.contains(&FILTER_NODELETE),
                    };
                    let wreq = WatchRequest {
                        range: KeyRange::between(c.key, c.range_end),
                        start_revision: c.start_revision,
                        prev_kv: c.prev_kv,
                        progress_notify: c.progress_notify,
                        filters,
                    };
                    self.create(c.watch_id, wreq).await
                }
                Some(PbWatchRequestUnion::CancelRequest(c)) => self.cancel(c.watch_id).await,
                Some(PbWatchRequestUnion::ProgressRequest(_)) => self.progress().await,
                None => true,
            };
            if !ok {
                break;
            }
        }
        tracing::trace!(watchers = self.watchers.len(), "watch session closed");
    }

    async fn send(&self, resp: PbWatchResponse) -> bool {
        self.out.send(Ok(resp)).await.is_ok()
    }

    async fn header_now(&self) -> Option<etcd_client::proto::PbResponseHeader> {
        let rev = match self.shared.current_revision().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "watch: cannot read current revision");
                0
            }
        };
        self.shared.header().at(rev)
    }

    async fn create(&mut self, requested_id: i64, req: WatchRequest) -> bool {
        self.watchers.retain(|_, w| !w.task.is_finished());
        let id = if requested_id != 0 {
            if self.watchers.contains_key(&requested_id) {
                return self
                    .send(PbWatchResponse {
                        header: self.header_now().await,
                        watch_id: INVALID_WATCH_ID,
                        created: true,
                        canceled: true,
                        cancel_reason: "mvcc: duplicate watch ID provided on the WatchStream"
                            .into(),
                        ..Default::default()
                    })
                    .await;
            }
            requested_id
        } else {
            // etcd hands out the lowest free ID starting from 0.
            let mut id = 0;
            while self.watchers.contains_key(&id) {
                id += 1;
            }
            id
        };

        let result = self.shared.backend.watch(req).await;
        let header = self.header_now().await;
        let created = PbWatchResponse {
            header,
            watch_id: id,
            created: true,
            ..Default::default()
        };
        match result {
            Ok(stream) => {
                if !self.send(created).await {
                    return false;
                }
                let (flush_tx, flush_rx) = mpsc::channel(4);
                let task = tokio::spawn(forward(
                    self.shared.clone(),
                    id,
                    stream,
                    self.out.clone(),
                    flush_rx,
                ));
                self.watchers.insert(
                    id,
                    Watcher {
                        task,
                        flush: flush_tx,
                    },
                );
                true
            }
            Err(e) => {
                tracing::debug!(watch_id = id, error = %e, "watch create failed");
                if !self.send(created).await {
                    return false;
                }
                self.send(cancel_response(header, id, &e)).await
            }
        }
    }

    async fn cancel(&mut self, id: i64) -> bool {
        let Some(w) = self.watchers.remove(&id) else {
            return true;
        };
        w.task.abort();
        let _ = w.task.await;
        let header = self.header_now().await;
        self.send(PbWatchResponse {
            header,
            watch_id: id,
            canceled: true,
            ..Default::default()
        })
        .await
    }

    async fn progress(&mut self) -> bool {
        // Read the revision first, then make every watcher flush what its stream has ready,
        // so the events at or below that revision are ahead of this response.
        let header = self.header_now().await;
        let mut acks = Vec::new();
        for w in self.watchers.values() {
            let (tx, rx) = oneshot::channel();
            if w.flush.send(tx).await.is_ok() {
                acks.push(rx);
            }
        }
        for ack in acks {
            let _ = ack.await;
        }
        self.send(PbWatchResponse {
            header,
            watch_id: INVALID_WATCH_ID,
            ..Default::default()
        })
        .await
    }
}

fn cancel_response(
    header: Option<etcd_client::proto::PbResponseHeader>,
    id: i64,
    err: &StoreError,
) -> PbWatchResponse {
    let (compact_revision, cancel_reason) = match err {
        StoreError::Compacted { compact_revision } => (
            *compact_revision,
            "mvcc: required revision has been compacted".to_string(),
        ),
        other => (0, other.to_string()),
    };
    PbWatchResponse {
        header,
        watch_id: id,
        canceled: true,
        compact_revision,
        cancel_reason,
        ..Default::default()
    }
}

/// What to do after handling one item of a backend watch stream.
enum Step {
    Continue,
    Stop,
}

async fn forward(
    shared: Arc<Shared>,
    id: i64,
    mut stream: WatchStream,
    out: Outbound,
    mut flush: mpsc::Receiver<oneshot::Sender<()>>,
) {
    loop {
        tokio::select! {
            item = stream.next() => {
                if let Step::Stop = deliver(&shared, id, item, &out).await {
                    return;
                }
            }
            Some(ack) = flush.recv() => {
                // Drain what is ready without waiting.
                while let Some(item) = stream.next().now_or_never() {
                    if let Step::Stop = deliver(&shared, id, item, &out).await {
                        let _ = ack.send(());
                        return;
                    }
                }
                let _ = ack.send(());
            }
        }
    }
}

async fn deliver(
    shared: &Shared,
    id: i64,
    item: Option<StoreResult<WatchBatch>>,
    out: &Outbound,
) -> Step {
    let resp = match item {
        Some(Ok(batch)) => PbWatchResponse {
            header: shared.header().at(batch.revision),
            watch_id: id,
            events: batch.events.into_iter().map(event_to_pb).collect(),
            ..Default::default()
        },
        Some(Err(e)) => {
            tracing::debug!(watch_id = id, error = %e, "watch canceled by the store");
            let header = shared.header().at(0);
            let _ = out.send(Ok(cancel_response(header, id, &e))).await;
            return Step::Stop;
        }
        None => {
            let header = shared.header().at(0);
            let e = StoreError::Stopped;
            let _ = out.send(Ok(cancel_response(header, id, &e))).await;
            return Step::Stop;
        }
    };
    if out.send(Ok(resp)).await.is_err() {
        return Step::Stop;
    }
    Step::Continue
}
