//! Client configuration: flags > environment > config file > defaults.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::errors::CliError;

pub const DEFAULT_API_URL: &str = "http://127.0.0.1:8080";
pub const DEFAULT_TENANT: &str = "default";

pub const ENV_API_URL: &str = "LATTICE_API_URL";
pub const ENV_TOKEN: &str = "LATTICE_TOKEN";
pub const ENV_TOKEN_FILE: &str = "LATTICE_TOKEN_FILE";
pub const ENV_TENANT: &str = "LATTICE_TENANT";
pub const ENV_CONFIG: &str = "LATTICE_CONFIG";
pub const ENV_CA_FILE: &str = "LATTICE_CA_FILE";
pub const ENV_VCLUSTER: &str = "LATTICE_VCLUSTER";
pub const ENV_COMPAT_CONFIG: &str = "LATTICE_COMPAT_CONFIG";

/// The on-disk config file (`~/.config/lattice/config.yaml`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// `default_tenant` is accepted too (the product spec's spelling).
    #[serde(
        default,
        alias = "default_tenant",
        skip_serializing_if = "Option::is_none"
    )]
    pub tenant: Option<String>,
    /// PEM CA bundle for an https API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// vCluster for `lattice submit` when the script names none (`vcluster` accepted too).
    #[serde(default, alias = "vcluster", skip_serializing_if = "Option::is_none")]
    pub default_vcluster: Option<String>,
    /// Default `-o`: table, wide, json or yaml.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_format: Option<String>,
    /// Keys this client does not know are kept when the file is rewritten.
    #[serde(flatten)]
    pub other: serde_yaml::Mapping,
}

/// Values given on the command line.
#[derive(Debug, Clone, Default)]
pub struct FlagValues {
    pub api_url: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub tenant: Option<String>,
    pub config: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub insecure: bool,
}

/// A snapshot of the environment variables the CLI reads (injectable for tests).
#[derive(Debug, Clone, Default)]
pub struct Env {
    vars: HashMap<String, String>,
}

impl Env {
    /// The process environment.
    pub fn from_process() -> Env {
        let keys = [
            ENV_API_URL,
            ENV_TOKEN,
            ENV_TOKEN_FILE,
            ENV_TENANT,
            ENV_CONFIG,
            ENV_CA_FILE,
            ENV_VCLUSTER,
            ENV_COMPAT_CONFIG,
            "XDG_CONFIG_HOME",
            "HOME",
            "USER",
            "LOGNAME",
            "SHELL",
            // Inside an allocation (`lattice session`, a batch script): `lattice launch`
            // and `srun` run there.
            "LATTICE_ALLOC_ID",
            "SLURM_JOB_ID",
        ];
        Env {
            vars: keys
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
                .collect(),
        }
    }

    /// An environment built from pairs.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Env {
        Env {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// A non-empty variable.
    pub fn get(&self, key: &str) -> Option<String> {
        self.vars.get(key).filter(|v| !v.is_empty()).cloned()
    }
}

/// Where the config file lives: `--config`, `$LATTICE_CONFIG`,
/// `$XDG_CONFIG_HOME/lattice/config.yaml`, `~/.config/lattice/config.yaml`.
pub fn config_path(flag: Option<&Path>, env: &Env) -> Option<PathBuf> {
    if let Some(p) = flag {
        return Some(p.to_path_buf());
    }
    if let Some(p) = env.get(ENV_CONFIG) {
        return Some(PathBuf::from(p));
    }
    if let Some(x) = env.get("XDG_CONFIG_HOME") {
        return Some(Path::new(&x).join("lattice").join("config.yaml"));
    }
    env.get("HOME").map(|h| {
        Path::new(&h)
            .join(".config")
            .join("lattice")
            .join("config.yaml")
    })
}

/// Reads the config file; a missing file is an empty config.
pub fn load_file(path: &Path) -> Result<FileConfig, CliError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(FileConfig::default()),
        Err(e) => {
            return Err(CliError::new(
                format!("read config file {}", path.display()),
                e.to_string(),
            )
            .hint("check the file's permissions, or point --config elsewhere"))
        }
    };
    if text.trim().is_empty() {
        return Ok(FileConfig::default());
    }
    serde_yaml::from_str(&text).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!(" (line {}, column {})", l.line(), l.column()))
            .unwrap_or_default();
        CliError::new(
            format!("read config file {}{at}", path.display()),
            e.to_string(),
        )
        .hint(
            "the file is YAML with keys api_url, token or token_file, and tenant; fix or remove it",
        )
    })
}

/// Writes the config file with 0600 permissions (it may hold a token).
pub fn save_file(path: &Path, cfg: &FileConfig) -> Result<(), CliError> {
    let what = || format!("write config file {}", path.display());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| CliError::new(what(), e.to_string()))?;
    }
    let text = serde_yaml::to_string(cfg).map_err(|e| CliError::new(what(), e.to_string()))?;
    write_private(path, text.as_bytes()).map_err(|e| {
        CliError::new(what(), e.to_string()).hint("check that the directory is writable")
    })
}

#[cfg(unix)]
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // The file may have existed with wider permissions.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(data)
}

#[cfg(not(unix))]
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, data)
}

/// Where a setting came from (shown by `lattice config view`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    File,
    Default,
}

/// The effective settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub api_url: String,
    pub api_url_source: Source,
    pub token: Option<String>,
    pub tenant: String,
    pub tenant_source: Source,
    pub config_path: Option<PathBuf>,
    /// CA bundle (PEM) to trust for https.
    pub ca_file: Option<PathBuf>,
    /// Skip TLS verification.
    pub insecure: bool,
    /// Default vCluster for submissions (`LATTICE_VCLUSTER` > file `default_vcluster`).
    pub default_vcluster: Option<String>,
    /// Default output format from the file (`output_format`).
    pub output_format: Option<String>,
}

fn read_token_file(path: &Path, origin: &str) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_string())
        .map_err(|e| {
            CliError::new(
                format!("read token file {} (from {origin})", path.display()),
                e.to_string(),
            )
            .hint("check the path, or pass the token itself with --token / LATTICE_TOKEN")
        })
}

/// Resolves the effective settings. Precedence: flags > environment > file > defaults;
/// at each level a token beats a token file.
pub fn resolve(flags: &FlagValues, env: &Env, file: &FileConfig) -> Result<Settings, CliError> {
    let nonempty = |o: &Option<String>| o.clone().filter(|s| !s.is_empty());
    let (api_url, api_url_source) = if let Some(u) = nonempty(&flags.api_url) {
        (u, Source::Flag)
    } else if let Some(u) = env.get(ENV_API_URL) {
        (u, Source::Env)
    } else if let Some(u) = nonempty(&file.api_url) {
        (u, Source::File)
    } else {
        (DEFAULT_API_URL.to_string(), Source::Default)
    };
    let (tenant, tenant_source) = if let Some(t) = nonempty(&flags.tenant) {
        (t, Source::Flag)
    } else if let Some(t) = env.get(ENV_TENANT) {
        (t, Source::Env)
    } else if let Some(t) = nonempty(&file.tenant) {
        (t, Source::File)
    } else {
        (DEFAULT_TENANT.to_string(), Source::Default)
    };
    let token = if let Some(t) = nonempty(&flags.token) {
        Some(t)
    } else if let Some(p) = &flags.token_file {
        Some(read_token_file(p, "--token-file")?)
    } else if let Some(t) = env.get(ENV_TOKEN) {
        Some(t)
    } else if let Some(p) = env.get(ENV_TOKEN_FILE) {
        Some(read_token_file(Path::new(&p), ENV_TOKEN_FILE)?)
    } else if let Some(t) = nonempty(&file.token) {
        Some(t)
    } else if let Some(p) = nonempty(&file.token_file) {
        Some(read_token_file(Path::new(&p), "the config file")?)
    } else {
        None
    };
    let api_url = normalize_url(&api_url);
    let ca_file = flags
        .ca_file
        .clone()
        .or_else(|| env.get(ENV_CA_FILE).map(PathBuf::from))
        .or_else(|| nonempty(&file.ca_file).map(PathBuf::from));
    Ok(Settings {
        api_url,
        api_url_source,
        token,
        tenant,
        tenant_source,
        config_path: None,
        ca_file,
        insecure: flags.insecure,
        default_vcluster: env
            .get(ENV_VCLUSTER)
            .or_else(|| nonempty(&file.default_vcluster)),
        output_format: nonempty(&file.output_format),
    })
}

/// Adds `http://` to a bare `host:port`.
pub fn normalize_url(u: &str) -> String {
    let u = u.trim().trim_end_matches('/');
    if u.starts_with("http://") || u.starts_with("https://") {
        u.to_string()
    } else {
        format!("http://{u}")
    }
}

/// Loads the file named by flags/env (an explicitly named file must exist unless
/// `allow_missing`) and resolves the settings.
pub fn load(flags: &FlagValues, env: &Env, allow_missing: bool) -> Result<Settings, CliError> {
    let path = config_path(flags.config.as_deref(), env);
    let file = match &path {
        Some(p) => {
            let explicit = flags.config.is_some() || env.get(ENV_CONFIG).is_some();
            if explicit && !allow_missing && !p.exists() {
                return Err(CliError::new(
                    format!("read config file {}", p.display()),
                    "no such file",
                )
                .hint("create it with `lattice config set-url URL`, or drop --config"));
            }
            load_file(p)?
        }
        None => FileConfig::default(),
    };
    let mut s = resolve(flags, env, &file)?;
    s.config_path = path;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_flags_env_file_default() {
        let file = FileConfig {
            api_url: Some("http://file:1".into()),
            token: Some("file-token".into()),
            tenant: Some("file-tenant".into()),
            ..Default::default()
        };
        let env = Env::from_pairs([(ENV_API_URL, "http://env:2"), (ENV_TENANT, "env-tenant")]);
        let flags = FlagValues {
            tenant: Some("flag-tenant".into()),
            ..Default::default()
        };
        let s = resolve(&flags, &env, &file).expect("settings");
        assert_eq!(s.api_url, "http://env:2");
        assert_eq!(s.api_url_source, Source::Env);
        assert_eq!(s.tenant, "flag-tenant");
        assert_eq!(s.tenant_source, Source::Flag);
        assert_eq!(s.token.as_deref(), Some("file-token"));
        assert_eq!(s.ca_file, None);

        let file = FileConfig {
            ca_file: Some("/file/ca.pem".into()),
            ..Default::default()
        };
        let env = Env::from_pairs([(ENV_CA_FILE, "/env/ca.pem")]);
        let s = resolve(&FlagValues::default(), &env, &file).expect("settings");
        assert_eq!(s.ca_file, Some(PathBuf::from("/env/ca.pem")));

        let s = resolve(
            &FlagValues::default(),
            &Env::default(),
            &FileConfig::default(),
        )
        .expect("settings");
        assert_eq!(s.api_url, DEFAULT_API_URL);
        assert_eq!(s.tenant, DEFAULT_TENANT);
        assert_eq!(s.token, None);
    }

    #[test]
    fn token_file_and_bare_host() {
        let dir = tempfile::tempdir().expect("tmp");
        let tf = dir.path().join("admin.token");
        std::fs::write(&tf, "secret\n").expect("write");
        let flags = FlagValues {
            token_file: Some(tf),
            api_url: Some("localhost:9000/".into()),
            ..Default::default()
        };
        let env = Env::from_pairs([(ENV_TOKEN, "env-token")]);
        let s = resolve(&flags, &env, &FileConfig::default()).expect("settings");
        assert_eq!(s.token.as_deref(), Some("secret"));
        assert_eq!(s.api_url, "http://localhost:9000");
    }

    #[test]
    fn config_path_order() {
        let env = Env::from_pairs([("HOME", "/h"), ("XDG_CONFIG_HOME", "/x")]);
        assert_eq!(
            config_path(None, &env),
            Some(PathBuf::from("/x/lattice/config.yaml"))
        );
        let env = Env::from_pairs([("HOME", "/h")]);
        assert_eq!(
            config_path(None, &env),
            Some(PathBuf::from("/h/.config/lattice/config.yaml"))
        );
        assert_eq!(
            config_path(Some(Path::new("/c.yaml")), &env),
            Some(PathBuf::from("/c.yaml"))
        );
    }

    #[test]
    fn save_is_private_and_roundtrips() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("sub").join("config.yaml");
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, "default_tenant: physics\ncolor: true\n").expect("write");
        let mut cfg = load_file(&p).expect("load");
        assert_eq!(cfg.tenant.as_deref(), Some("physics"));
        cfg.token = Some("t".into());
        save_file(&p, &cfg).expect("save");
        let back = load_file(&p).expect("load");
        assert_eq!(back.token.as_deref(), Some("t"));
        assert!(back.other.contains_key("color"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn bad_config_names_line() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("config.yaml");
        std::fs::write(&p, "api_url: x\ntenant: [unclosed\n").expect("write");
        let e = load_file(&p).expect_err("bad");
        assert!(e.what.contains("line"), "{e}");
    }
}
