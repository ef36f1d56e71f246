//! The flags, their environment variables and the config file agree.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use lattice_config::ConfigFile;

use super::*;

/// The long flags `lattice-server --help` shows.
fn help_flags() -> BTreeSet<String> {
    lattice_config::help_long_flags(&Args::command())
}

fn keys() -> BTreeSet<String> {
    lattice_config::keys(&Args::command())
        .into_iter()
        .map(String::from)
        .collect()
}

#[test]
fn every_flag_of_help_is_a_config_key_and_every_key_a_flag() {
    let mut flags = help_flags();
    for not_a_key in ["help", "version", "config"] {
        assert!(flags.remove(not_a_key), "--{not_a_key} missing from --help");
    }
    assert!(flags.len() > 50, "{flags:?}");
    assert_eq!(flags, keys());
}

#[test]
fn every_flag_has_its_environment_variable() {
    let cmd = Args::command();
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        let expected = match long {
            "help" | "version" => continue,
            // LATTICE_CONFIG is the CLI's config file.
            "config" => "LATTICE_SERVER_CONFIG".to_string(),
            // The agent's LATTICE_NODE_ID is a node's name; this is a Raft member's number.
            "node-id" => "LATTICE_RAFT_NODE_ID".to_string(),
            _ => format!("LATTICE_{}", long.to_uppercase().replace('-', "_")),
        };
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            Some(expected.as_str()),
            "--{long}"
        );
    }
}

/// Every key is taken in a file, with a value its flag accepts: its default, or one of
/// a few typical values (a path, an address, a number, a switch).
#[test]
fn every_key_is_accepted_in_a_file() {
    let cmd = Args::command();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("server.toml");
    for arg in cmd.get_arguments() {
        let Some(key) = arg.get_long() else { continue };
        if !keys().contains(key) {
            continue;
        }
        let mut candidates: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|d| format!("{key} = {:?}", d.to_str().unwrap()))
            .collect();
        candidates.extend(
            ["true", "\"/etc/lattice/x\"", "\"10.0.0.1:7001\"", "4096"]
                .iter()
                .map(|v| format!("{key} = {v}")),
        );
        let accepted = candidates.iter().find(|line| {
            std::fs::write(&path, format!("{line}\n")).unwrap();
            ConfigFile::load(&path, &cmd).is_ok()
        });
        assert!(accepted.is_some(), "no value accepted for key {key}");
    }
}

#[test]
fn settings_come_from_file_environment_and_command_line_in_that_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.toml");
    std::fs::write(
        &file,
        "data-dir = \"/var/lib/lattice\"\nstore-threads = 3\nnode-id = 2\n\
         tls-san = [\"lattice.example.org\", \"10.0.0.5\"]\nheartbeat-timeout = \"45s\"\n\
         raft-addr = \"0.0.0.0:7001\"\njoin = \"lattice-0:7001\"\nuser-qps = 7\n\
         store-plaintext-loopback = true\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let a: Args =
        lattice_config::try_parse_from(["lattice-server", "--config", file, "--node-id", "5"])
            .unwrap();
    let s = a.serve;
    assert_eq!(s.data_dir.as_deref(), Some(Path::new("/var/lib/lattice")));
    assert_eq!(s.store_threads, 3);
    assert_eq!(s.node_id, 5);
    assert_eq!(s.tls_sans, ["lattice.example.org", "10.0.0.5"]);
    assert_eq!(s.heartbeat_timeout, Duration::from_secs(45));
    assert_eq!(s.join.as_deref(), Some("lattice-0:7001"));
    assert!(s.store_tls.store_plaintext_loopback);
    assert_eq!(s.api_limits.identity_limits().users.requests_per_second, 7);
    // Defaults for what the file leaves out.
    assert_eq!(s.etcd_addr, "127.0.0.1:2379");
    // The flags' rules hold for the file: --join conflicts with --bootstrap.
    let e = lattice_config::try_parse_from::<Args, _, _>([
        "lattice-server",
        "--config",
        file,
        "--bootstrap",
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("cannot be used with"), "{e}");
    // The tools do not read it.
    let a: Args = lattice_config::try_parse_from([
        "lattice-server",
        "--config",
        file,
        "backup",
        "verify",
        "b.lbk",
    ])
    .unwrap();
    assert!(matches!(a.command, Some(Cmd::Backup { .. })));
}

#[test]
fn bad_values_say_which_key_and_what_it_takes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.toml");
    let parse = |text: &str| {
        std::fs::write(&file, text).unwrap();
        lattice_config::try_parse_from::<Args, _, _>([
            "lattice-server",
            "--config",
            file.to_str().unwrap(),
        ])
        .unwrap_err()
        .to_string()
    };
    let e = parse("quota-backend-bytes = \"lots\"\n");
    assert!(
        e.contains(
            "server.toml:1: `quota-backend-bytes = \"lots\"`: \"lots\": not a number of bytes"
        ),
        "{e}"
    );
    assert!(
        e.contains("set it to what --quota-backend-bytes takes"),
        "{e}"
    );
    let e = parse("backend = \"consul\"\n");
    assert!(e.contains("\"consul\" is not one of embedded, etcd"), "{e}");
    let e = parse("data_dir = \"/var/lib/lattice\"\n");
    assert!(e.contains("unknown key `data_dir`"), "{e}");
    assert!(e.contains("did you mean `data-dir`?"), "{e}");
}

/// The examples under manifests/deploy/ stay valid as the flags change.
#[test]
fn example_config_files_are_valid() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../manifests/deploy");
    // A copy in a directory of the test's own: run as root, the server takes its config
    // only from a path nobody else may write, and a checkout's directories may be looser.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.toml");
    std::fs::copy(root.join("server.toml"), &file).unwrap();
    let f = ConfigFile::load(&file, &Args::command()).unwrap();
    assert!(f.keys().any(|k| k == "data-dir"));
    let a: Args = lattice_config::try_parse_from([
        "lattice-server".as_ref(),
        "--config".as_ref(),
        file.as_os_str(),
    ])
    .unwrap();
    assert_eq!(
        a.serve.data_dir.as_deref(),
        Some(Path::new("/var/lib/lattice"))
    );
}
