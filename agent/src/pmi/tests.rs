//! The PMI server against a client speaking each wire over the real socket pair.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;

use super::*;

fn info(ranks: Vec<u32>, size: u32) -> StepInfo {
    StepInfo {
        jobid: "job.0".into(),
        size,
        mapping: "(vector,(0,1,2))".into(),
        local_ranks: ranks,
        node: "n0".into(),
    }
}

struct V1(BufReader<UnixStream>);

impl V1 {
    fn ask(&mut self, line: &str) -> String {
        self.0
            .get_mut()
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        let mut out = String::new();
        self.0.read_line(&mut out).unwrap();
        out.trim_end().to_string()
    }
}

struct V2(UnixStream);

impl V2 {
    fn ask(&mut self, body: &str) -> String {
        self.0
            .write_all(format!("{:<6}{body}", body.len()).as_bytes())
            .unwrap();
        let mut len = [0u8; 6];
        self.0.read_exact(&mut len).unwrap();
        let n: usize = std::str::from_utf8(&len).unwrap().trim().parse().unwrap();
        let mut b = vec![0u8; n];
        self.0.read_exact(&mut b).unwrap();
        String::from_utf8(b).unwrap()
    }
}

/// The next event of a step's PMI server (within 5 s).
async fn next_event(rx: &mut mpsc::UnboundedReceiver<PmiEvent>) -> PmiEvent {
    tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap()
}

fn client(fd: OwnedFd) -> UnixStream {
    let s = UnixStream::from(fd);
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pmi1_and_pmi2_ranks_share_one_fence() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (_server, mut fds) =
        PmiServer::start(info(vec![0, 1], 2), Arc::new(LocalExchange), tx).unwrap();
    let (f1, f0) = (fds.pop().unwrap(), fds.pop().unwrap());
    // Rank 0 speaks PMI-1 (MPICH), rank 1 PMI-2 (libpmi2), on the same server.
    let r0 = std::thread::spawn(move || {
        let mut c = V1(BufReader::new(client(f0)));
        let init = c.ask("cmd=init pmi_version=1 pmi_subversion=1");
        assert!(
            init.starts_with("cmd=response_to_init") && init.contains("rc=0"),
            "{init}"
        );
        assert!(c.ask("cmd=get_maxes").contains("vallen_max=1024"));
        assert_eq!(
            c.ask("cmd=get_my_kvsname"),
            "cmd=my_kvsname rc=0 kvsname=job.0"
        );
        assert_eq!(
            c.ask("cmd=get kvsname=job.0 key=PMI_process_mapping"),
            "cmd=get_result rc=0 value=(vector,(0,1,2))"
        );
        assert_eq!(
            c.ask("cmd=put kvsname=job.0 key=card-0 value=A0"),
            "cmd=put_result rc=0"
        );
        assert_eq!(c.ask("cmd=barrier_in"), "cmd=barrier_out rc=0");
        assert_eq!(
            c.ask("cmd=get kvsname=job.0 key=card-1"),
            "cmd=get_result rc=0 value=B;1"
        );
        assert!(c.ask("cmd=get kvsname=job.0 key=nope").contains("rc=1"));
        assert_eq!(c.ask("cmd=finalize"), "cmd=finalize_ack rc=0");
    });
    let r1 = std::thread::spawn(move || {
        let mut c = V1(BufReader::new(client(f1)));
        assert!(c
            .ask("cmd=init pmi_version=2 pmi_subversion=0")
            .contains("pmi_version=2"));
        let mut c = V2(c.0.into_inner());
        let full = c.ask("cmd=fullinit;pmijobid=job.0;pmirank=1;threaded=FALSE;");
        assert!(full.starts_with("cmd=fullinit-response;rc=0;"), "{full}");
        assert!(full.contains(";rank=1;size=2;appnum=0;"), "{full}");
        assert!(!full.contains("spawner-jobid"), "{full}");
        assert_eq!(
            c.ask("cmd=job-getid;"),
            "cmd=job-getid-response;rc=0;jobid=job.0;"
        );
        assert_eq!(
            c.ask("cmd=info-getjobattr;key=PMI_process_mapping;"),
            "cmd=info-getjobattr-response;rc=0;found=TRUE;value=(vector,(0,1,2));"
        );
        assert_eq!(
            c.ask("cmd=kvs-put;key=card-1;value=B;;1;"),
            "cmd=kvs-put-response;rc=0;"
        );
        assert_eq!(c.ask("cmd=kvs-fence;"), "cmd=kvs-fence-response;rc=0;");
        assert_eq!(
            c.ask("cmd=kvs-get;jobid=job.0;srcid=0;key=card-0;"),
            "cmd=kvs-get-response;rc=0;found=TRUE;value=A0;"
        );
        assert_eq!(
            c.ask("cmd=kvs-get;jobid=job.0;srcid=-1;key=missing;"),
            "cmd=kvs-get-response;rc=0;found=FALSE;"
        );
        assert!(c.ask("cmd=spawn;ncmds=1;").contains("rc=-1"));
        assert_eq!(c.ask("cmd=finalize;"), "cmd=finalize-response;rc=0;");
    });
    tokio::task::spawn_blocking(move || {
        r0.join().unwrap();
        r1.join().unwrap();
    })
    .await
    .unwrap();
    // Both finalized: closing the sockets is no abort.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(rx.try_recv().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_that_dies_or_aborts_ends_the_step() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (_server, mut fds) =
        PmiServer::start(info(vec![4, 5, 6], 8), Arc::new(LocalExchange), tx).unwrap();
    let (f6, f5, f4) = (fds.pop().unwrap(), fds.pop().unwrap(), fds.pop().unwrap());
    // Rank 6 never speaks PMI (a task of a step that is not MPI): its end is no abort.
    drop(f6);
    // Rank 4 initializes, then dies.
    let mut c = V1(BufReader::new(client(f4)));
    tokio::task::spawn_blocking(move || {
        c.ask("cmd=init pmi_version=1 pmi_subversion=1");
        drop(c);
    })
    .await
    .unwrap();
    let ev = next_event(&mut rx).await;
    assert_eq!(
        ev,
        PmiEvent::Abort(
            "rank 4 on node n0 ended without PMI finalize (it exited or crashed inside MPI)".into()
        )
    );
    // Rank 5, waiting in a fence, is answered with an error instead of hanging.
    let mut c = V2(client(f5));
    let out = tokio::task::spawn_blocking(move || {
        c.0.write_all(b"cmd=init pmi_version=2 pmi_subversion=0\n")
            .unwrap();
        let mut line = [0u8; 1];
        let mut got = Vec::new();
        while line[0] != b'\n' {
            c.0.read_exact(&mut line).unwrap();
            got.push(line[0]);
        }
        c.ask("cmd=kvs-fence;")
    })
    .await
    .unwrap();
    assert!(out.starts_with("cmd=kvs-fence-response;rc=-1;"), "{out}");

    // PMI2_Abort: the message is kept.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (_server, mut fds) =
        PmiServer::start(info(vec![0], 1), Arc::new(LocalExchange), tx).unwrap();
    let mut c = V2(client(fds.pop().unwrap()));
    tokio::task::spawn_blocking(move || {
        c.0.write_all(b"cmd=init pmi_version=2 pmi_subversion=0\n")
            .unwrap();
        let mut b = [0u8; 64];
        let _ = c.0.read(&mut b).unwrap();
        let body = "cmd=abort;isworld=TRUE;msg=bad input;; giving up;";
        c.0.write_all(format!("{:06}{body}", body.len()).as_bytes())
            .unwrap();
    })
    .await
    .unwrap();
    let ev = next_event(&mut rx).await;
    assert_eq!(
        ev,
        PmiEvent::Abort("rank 0 on node n0 called PMI2_Abort: bad input; giving up".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_socket_is_refused_without_a_panic() {
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_server, mut fds) =
        PmiServer::start(info(vec![0], 1), Arc::new(LocalExchange), tx).unwrap();
    let mut s = client(fds.pop().unwrap());
    tokio::task::spawn_blocking(move || {
        s.write_all(&vec![b'x'; wire::MAX_LINE + 10]).unwrap();
        let mut b = Vec::new();
        // The server closes the connection.
        let _ = s.read_to_end(&mut b);
        assert!(b.is_empty());
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_cannot_fill_the_agents_memory() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (_server, mut fds) =
        PmiServer::start(info(vec![0], 1), Arc::new(LocalExchange), tx).unwrap();
    let mut c = V1(BufReader::new(client(fds.pop().unwrap())));
    let answers = tokio::task::spawn_blocking(move || {
        c.ask("cmd=init pmi_version=1 pmi_subversion=1");
        let value = "x".repeat(3000);
        // A one-rank step may hold 256 KiB: the 88th value of 3 KB is refused.
        (0..100)
            .map(|i| c.ask(&format!("cmd=put kvsname=k key=k{i} value={value}")))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(answers[0], "cmd=put_result rc=0");
    let refused = answers.iter().position(|a| a.contains("rc=-1")).unwrap();
    assert_eq!(refused, 87);
    let Some(PmiEvent::Abort(why)) = rx.recv().await else {
        panic!("no abort")
    };
    assert!(why.contains("more than its budget of 262144"), "{why}");
    // Messages are cut and cleaned before they reach a status.
    let long = tidy(&format!("a\nb{}", "é".repeat(2000)));
    assert!(long.starts_with("a b") && long.ends_with("...") && long.len() <= 1030);
}
