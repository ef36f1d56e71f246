use super::*;
use clap::Parser;

/// A daemon's flags in miniature: a value, a list, a switch, an enum, a parsed type,
/// flags that need each other or exclude each other, an environment variable.
#[derive(Parser, Debug)]
#[command(name = "demo")]
struct Args {
    #[command(subcommand)]
    tool: Option<Tool>,
    /// A TOML file of flag values.
    #[arg(long, env = "DEMO_TEST_CONFIG")]
    config: Option<PathBuf>,
    /// Where data lives.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Listen address. Also used by peers.
    #[arg(long, default_value = "127.0.0.1:7001", env = "DEMO_TEST_ADDR")]
    addr: std::net::SocketAddr,
    /// Extra names.
    #[arg(long = "san", value_name = "NAME")]
    sans: Vec<String>,
    /// Endpoints, comma separated.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Form a new cluster.
    #[arg(long, requires = "data_dir")]
    bootstrap: bool,
    /// Join one.
    #[arg(long, conflicts_with = "bootstrap")]
    join: Option<String>,
    /// Storage backend.
    #[arg(long, value_enum, default_value_t = Backend::Embedded)]
    backend: Backend,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum Backend {
    Embedded,
    Etcd,
}

#[derive(clap::Subcommand, Debug)]
enum Tool {
    Backup { file: PathBuf },
}

/// Held by the tests that set environment variables and those that read the variables'
/// absence (the tests of one binary share the environment).
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn file(&self, text: &str) -> String {
        let path = self.dir.path().join("demo.toml");
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    }

    fn parse(&self, text: &str, extra: &[&str]) -> Result<Args, String> {
        let file = self.file(text);
        let mut args = vec!["demo", "--config", &file];
        args.extend_from_slice(extra);
        try_parse_from::<Args, _, _>(args).map_err(|e| e.to_string())
    }
}

#[test]
fn file_sets_what_the_command_line_does_not() {
    let _env = ENV.lock().unwrap();
    let f = Fixture::new();
    let a = f
        .parse(
            "data-dir = \"/var/lib/demo\"\nthreads = 4\nsan = [\"a.example\", \"10.0.0.5\"]\n\
             endpoints = \"h1:2379,h2:2379\"\nbootstrap = true\nbackend = \"etcd\"\n",
            &[],
        )
        .unwrap();
    assert_eq!(a.data_dir.as_deref(), Some(Path::new("/var/lib/demo")));
    assert_eq!(a.threads, 4);
    assert_eq!(a.sans, ["a.example", "10.0.0.5"]);
    assert_eq!(a.endpoints, ["h1:2379", "h2:2379"]);
    assert!(a.bootstrap);
    assert_eq!(a.backend, Backend::Etcd);
    // Defaults stay for what the file leaves out.
    assert_eq!(a.addr.to_string(), "127.0.0.1:7001");
}

#[test]
fn command_line_beats_environment_beats_file() {
    let _env = ENV.lock().unwrap();
    let f = Fixture::new();
    let text = "addr = \"10.0.0.1:1\"\nthreads = 4\nsan = [\"from-file\"]\n";
    std::env::set_var("DEMO_TEST_ADDR", "10.0.0.2:2");
    let from_env = f.parse(text, &[]);
    let from_flag = f.parse(
        text,
        &["--addr", "10.0.0.3:3", "--threads", "8", "--san", "x"],
    );
    std::env::remove_var("DEMO_TEST_ADDR");
    let from_file = f.parse(text, &[]).unwrap();
    assert_eq!(from_file.addr.to_string(), "10.0.0.1:1");
    assert_eq!(from_env.unwrap().addr.to_string(), "10.0.0.2:2");
    let from_flag = from_flag.unwrap();
    assert_eq!(from_flag.addr.to_string(), "10.0.0.3:3");
    assert_eq!(from_flag.threads, 8);
    // A list on the command line replaces the file's, it does not add to it.
    assert_eq!(from_flag.sans, ["x"]);
}

#[test]
fn unknown_keys_name_the_file_the_line_and_a_near_key() {
    let f = Fixture::new();
    let e = f
        .parse("threads = 2\ndata_dir = \"/x\"\n", &[])
        .unwrap_err();
    assert!(e.contains("demo.toml:2: unknown key `data_dir`"), "{e}");
    assert!(e.contains("did you mean `data-dir`?"), "{e}");
    let e = f.parse("colour = \"blue\"\n", &[]).unwrap_err();
    assert!(
        e.contains("demo.toml:1: unknown key `colour`: not a flag of demo"),
        "{e}"
    );
    assert!(!e.contains("did you mean"), "{e}");
    let e = f.parse("config = \"/etc/other.toml\"\n", &[]).unwrap_err();
    assert!(e.contains("cannot name another"), "{e}");
    let e = f.parse("help = true\n", &[]).unwrap_err();
    assert!(e.contains("unknown key `help`"), "{e}");
    let e = f.parse("[server]\nthreads = 2\n", &[]).unwrap_err();
    assert!(e.contains("unknown key `server`"), "{e}");
}

#[test]
fn bad_values_name_the_key_and_what_it_takes() {
    let f = Fixture::new();
    let e = f.parse("threads = \"many\"\n", &[]).unwrap_err();
    assert!(
        e.contains("demo.toml:1: `threads = \"many\"`: invalid digit"),
        "{e}"
    );
    assert!(
        e.contains("set it to what --threads takes (THREADS): Worker threads"),
        "{e}"
    );
    let e = f.parse("\n\nbackend = \"etc\"\n", &[]).unwrap_err();
    assert!(e.contains("demo.toml:3:"), "{e}");
    assert!(e.contains("\"etc\" is not one of embedded, etcd"), "{e}");
    let e = f.parse("addr = \"somewhere\"\n", &[]).unwrap_err();
    assert!(
        e.contains("`addr = \"somewhere\"`: invalid socket address"),
        "{e}"
    );
    let e = f.parse("bootstrap = \"yes\"\n", &[]).unwrap_err();
    assert!(
        e.contains("--bootstrap is a switch; write `bootstrap = true`"),
        "{e}"
    );
    let e = f.parse("threads = [1, 2]\n", &[]).unwrap_err();
    assert!(
        e.contains("--threads takes one value (THREADS), not a list"),
        "{e}"
    );
    let e = f.parse("threads = 1979-05-27\n", &[]).unwrap_err();
    assert!(e.contains("write it as a string or a number"), "{e}");
    let e = f.parse("threads = \n", &[]).unwrap_err();
    assert!(e.contains("demo.toml:1: not TOML"), "{e}");
    let e = try_parse_from::<Args, _, _>(["demo", "--config", "/nonexistent/demo.toml"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/nonexistent/demo.toml: cannot read the config file"),
        "{e}"
    );
}

#[test]
fn rules_between_flags_hold_for_the_file() {
    let f = Fixture::new();
    // `bootstrap` requires `data-dir`.
    let e = f.parse("bootstrap = true\n", &[]).unwrap_err();
    assert!(e.contains("--data-dir"), "{e}");
    assert!(e.contains("with the settings of the config file"), "{e}");
    // `join` conflicts with `bootstrap`, whether from the file or the command line.
    let e = f
        .parse("data-dir = \"/x\"\nbootstrap = true\n", &["--join", "h:1"])
        .unwrap_err();
    assert!(e.contains("cannot be used with"), "{e}");
    // A file's requirement met on the command line, and the other way round.
    assert!(f.parse("bootstrap = true\n", &["--data-dir", "/x"]).is_ok());
    assert!(f.parse("data-dir = \"/x\"\n", &["--bootstrap"]).is_ok());
    // A switch set to false is as if left out.
    assert!(f.parse("bootstrap = false\n", &["--join", "h:1"]).is_ok());
}

#[test]
fn config_from_the_environment_and_not_for_subcommands() {
    let _env = ENV.lock().unwrap();
    let f = Fixture::new();
    let file = f.file("threads = 3\n");
    std::env::set_var("DEMO_TEST_CONFIG", &file);
    let a = try_parse_from::<Args, _, _>(["demo"]);
    std::env::remove_var("DEMO_TEST_CONFIG");
    assert_eq!(a.unwrap().threads, 3);
    // A tool (a subcommand) does not read the daemon's file, even a broken one.
    let file = f.file("no-such-flag = 1\n");
    let a = try_parse_from::<Args, _, _>(["demo", "--config", &file, "backup", "b.file"]).unwrap();
    assert!(matches!(a.tool, Some(Tool::Backup { .. })));
    // Help still works with a file.
    let e = try_parse_from::<Args, _, _>(["demo", "--config", &file, "--help"]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DisplayHelp);
}

#[test]
fn every_long_flag_is_a_key() {
    let cmd = <Args as clap::CommandFactory>::command();
    assert_eq!(
        keys(&cmd),
        [
            "data-dir",
            "addr",
            "san",
            "endpoints",
            "threads",
            "bootstrap",
            "join",
            "backend"
        ]
    );
}

#[test]
fn the_hint_is_the_first_sentence_of_the_help() {
    #[derive(Parser, Debug)]
    struct Url {
        #[arg(long)]
        config: Option<PathBuf>,
        /// The base URL, e.g. http://prometheus:9090. Without it nothing is queried.
        #[arg(long, value_parser = clap::value_parser!(u8))]
        url: Option<u8>,
    }
    let f = Fixture::new();
    let file = f.file("url = \"x\"\n");
    let e = try_parse_from::<Url, _, _>(["url", "--config", &file])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("(URL): The base URL, e.g. http://prometheus:9090.\n"),
        "{e}"
    );
}

#[test]
fn a_root_daemon_takes_its_file_only_from_root() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, "node-id = \"n1\"\n").unwrap();
    let set = |mode: u32| {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    // Writable by others: whoever could write it would choose a root daemon's settings.
    set(0o666);
    let e = only_root_writes(&path).unwrap_err();
    assert!(e.to_string().contains("chmod go-w"), "{e}");
    set(0o620);
    assert!(only_root_writes(&path).is_err());
    // A group- or world-writable directory above it is as bad as the file.
    set(0o644);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = only_root_writes(&path).unwrap_err();
    assert!(
        e.to_string().contains(&dir.path().display().to_string()),
        "{e}"
    );
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    if nix::unistd::geteuid().is_root() {
        // Root's file in root's directory (under the sticky /tmp): taken.
        only_root_writes(&path).unwrap();
    } else {
        // Not root's: refused whatever its mode.
        assert!(only_root_writes(&path).is_err());
    }
}

#[test]
fn the_help_shows_every_long_flag() {
    let cmd = <Args as clap::CommandFactory>::command();
    let shown = help_long_flags(&cmd);
    for k in keys(&cmd) {
        assert!(shown.contains(k), "--{k} missing from {shown:?}");
    }
    assert!(
        shown.contains("help") && shown.contains("config"),
        "{shown:?}"
    );
}
