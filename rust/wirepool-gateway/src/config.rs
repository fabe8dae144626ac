//! The binary's TOML config file (`--config FILE`): every key optional, unknown keys refused;
//! a command-line flag given counts over the file's value.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A duration written as in `wirepool-timeout`: `250ms`, `10s`, `5M`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        wirepool_gateway::parse_timeout(&text)
            .map(Dur)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "{text:?} is not a duration such as \"250ms\" or \"10s\""
                ))
            })
    }
}

/// The whole file.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub listen: Option<SocketAddr>,
    pub workers: Option<usize>,
    pub max_in_flight: Option<u32>,
    pub queue: Option<usize>,
    /// The worker program and its arguments.
    pub command: Option<Vec<String>>,
    /// Methods the workers must offer: `NAME` or `NAME:stream`.
    pub methods: Option<Vec<String>>,
    #[serde(default)]
    pub limits: Limits,
    pub tls: Option<Tls>,
    /// Per-method limits, by method name.
    #[serde(default)]
    pub routes: BTreeMap<String, Route>,
    pub remote: Option<Remote>,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub max_body_bytes: Option<usize>,
    pub max_header_bytes: Option<usize>,
    pub header_timeout: Option<Dur>,
    pub body_timeout: Option<Dur>,
    pub max_connections: Option<usize>,
    pub grace: Option<Dur>,
    pub retry_after_secs: Option<u32>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub max_body_bytes: Option<usize>,
    pub timeout: Option<Dur>,
}

/// How remote workers are started.
#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum LauncherKind {
    /// Children of the gateway that join the listener with a ticket.
    Subprocess,
    /// Started by something else with the pool's ticket (written to `ticket_file`).
    External,
}

/// The pool's listener for remote workers (docs/REMOTE.md) and the workers that join it.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Remote {
    pub listen: Option<SocketAddr>,
    pub advertise: Option<String>,
    pub workers: usize,
    pub launcher: LauncherKind,
    /// External: where the pool's ticket is written once the listener is up.
    pub ticket_file: Option<PathBuf>,
    pub join_wait: Option<Dur>,
}

/// A config file is a few KiB; more is refused before it is read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl Config {
    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        if let Some(r) = &config.remote {
            if r.launcher == LauncherKind::External && r.ticket_file.is_none() {
                return Err("remote: an external launcher needs ticket_file".into());
            }
        }
        if config.command.as_ref().is_some_and(|c| c.is_empty()) {
            return Err("command: the worker program is not empty".into());
        }
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Config, String> {
        let shown = path.display();
        let len = std::fs::metadata(path)
            .map_err(|e| format!("config {shown}: {e}"))?
            .len();
        if len > MAX_CONFIG_BYTES {
            return Err(format!(
                "config {shown}: {len} bytes, more than {MAX_CONFIG_BYTES}"
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("config {shown}: {e}"))?;
        Config::parse(&text).map_err(|e| format!("config {shown}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's example, whole.
    fn readme_example() -> String {
        let readme = include_str!("../README.md");
        let start = readme
            .find("```toml\n")
            .expect("a ```toml block in the README")
            + "```toml\n".len();
        let len = readme[start..].find("```").expect("its end");
        readme[start..start + len].to_string()
    }

    #[test]
    fn the_readme_example_parses_whole() {
        let c = Config::parse(&readme_example()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.listen, Some("127.0.0.1:8443".parse().unwrap()));
        assert_eq!(c.workers, Some(4));
        assert_eq!(c.max_in_flight, Some(64));
        assert_eq!(c.queue, Some(128));
        assert_eq!(
            c.command,
            Some(vec!["python".to_string(), "worker.py".to_string()])
        );
        assert_eq!(
            c.methods,
            Some(vec!["add".to_string(), "decls:stream".to_string()])
        );
        assert_eq!(c.limits.max_body_bytes, Some(1_048_576));
        assert_eq!(c.limits.max_header_bytes, Some(16_384));
        assert_eq!(c.limits.header_timeout, Some(Dur(Duration::from_secs(10))));
        assert_eq!(c.limits.body_timeout, Some(Dur(Duration::from_secs(30))));
        assert_eq!(c.limits.max_connections, Some(1024));
        assert_eq!(c.limits.grace, Some(Dur(Duration::from_secs(10))));
        assert_eq!(c.limits.retry_after_secs, Some(1));
        assert_eq!(
            c.tls,
            Some(Tls {
                cert: "/etc/wirepool/cert.pem".into(),
                key: "/etc/wirepool/key.pem".into()
            })
        );
        assert_eq!(c.routes["add"].max_body_bytes, Some(4096));
        assert_eq!(
            c.routes["add"].timeout,
            Some(Dur(Duration::from_millis(250)))
        );
        assert_eq!(
            c.routes["decls"].timeout,
            Some(Dur(Duration::from_secs(60)))
        );
        let r = c.remote.expect("the remote section");
        assert_eq!(r.listen, Some("0.0.0.0:7700".parse().unwrap()));
        assert_eq!(r.advertise.as_deref(), Some("pool.internal"));
        assert_eq!((r.workers, r.launcher), (2, LauncherKind::External));
        assert_eq!(r.ticket_file, Some("/run/wirepool/ticket".into()));
        assert_eq!(r.join_wait, Some(Dur(Duration::from_secs(120))));
    }

    #[test]
    fn an_empty_file_is_all_defaults() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        for (text, key) in [
            ("listne = \"127.0.0.1:1\"", "listne"),
            ("[limits]\nmax_body = 10", "max_body"),
            ("[routes.add]\ntimout = \"1s\"", "timout"),
            (
                "[tls]\ncert = \"a\"\nkey = \"b\"\npassword = \"c\"",
                "password",
            ),
            ("[nope]\n", "nope"),
        ] {
            let e = Config::parse(text).unwrap_err();
            assert!(
                e.contains("unknown field") && e.contains(key),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn bad_values_are_refused_with_the_key() {
        for (text, words) in [
            ("workers = \"four\"", &["workers", "expected usize"][..]),
            ("workers = -1", &["workers"][..]),
            ("listen = \"localhost\"", &["listen", "socket address"][..]),
            (
                "[limits]\nheader_timeout = \"soon\"",
                &["header_timeout", "not a duration"][..],
            ),
            (
                "[limits]\nheader_timeout = 10",
                &["header_timeout", "string"][..],
            ),
            ("[tls]\ncert = \"a\"", &["key"][..]),
            (
                "[remote]\nworkers = 1\nlauncher = \"ssh\"",
                &["launcher", "ssh"][..],
            ),
            (
                "[remote]\nworkers = 1\nlauncher = \"external\"",
                &["ticket_file"][..],
            ),
            ("command = []", &["command"][..]),
            ("workers = 1\nworkers = 2", &["workers"][..]),
        ] {
            let e = Config::parse(text).unwrap_err();
            for w in words {
                assert!(e.contains(w), "{text:?}: {w:?} not in {e}");
            }
        }
    }
}
