//! `man`: the manual pages, generated from the same definitions as
//! `--help`: `fleetcoord(1)` and one page per subcommand, which is what
//! the SUBCOMMANDS section of each page refers to (`fleetcoord-elect(1)`,
//! `fleetcoord-kv-get(1)`), plus the sections clap does not write: EXIT
//! STATUS, ENVIRONMENT, EXAMPLES, SEE ALSO.

use crate::CliError;
use clap_mangen::roff::{bold, italic, roman, Inline, Roff};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// The subcommand whose page to print, e.g. `elect` or `kv get`
    /// (default: the page of fleetcoord itself).
    #[arg(value_name = "SUBCOMMAND", conflicts_with = "all")]
    subcommand: Vec<String>,
    /// Write every page into DIR instead (fleetcoord.1,
    /// fleetcoord-elect.1, fleetcoord-kv-get.1, ...), one file each, and
    /// print their paths.
    #[arg(long, value_name = "DIR")]
    all: Option<PathBuf>,
}

/// Every variable the tool reads, with what it stands for. A unit test
/// checks the sources name no other.
pub const ENVIRONMENT: [(&str, &str); 19] = [
    ("ETCD_ENDPOINTS", "etcd endpoints when --endpoints is absent."),
    (
        "ETCDCTL_ENDPOINTS",
        "etcd endpoints when neither --endpoints nor ETCD_ENDPOINTS is set (etcdctl's variable; http:// URLs included).",
    ),
    ("ETCDCTL_CACERT", "--cacert when the flag is absent."),
    ("ETCDCTL_CERT", "--cert when the flag is absent."),
    ("ETCDCTL_KEY", "--key when the flag is absent."),
    ("ETCDCTL_USER", "--user when the flag is absent."),
    (
        "ETCDCTL_PASSWORD",
        "The password of a --user given without one, when there is no --password-file.",
    ),
    (
        "COORD",
        "The backend of kv, pub, sub and stream when --coord is absent: etcd, nats or redis (default etcd).",
    ),
    ("COORD_URL", "--coord-url when the flag is absent."),
    ("COORD_TLS_CA", "--coord-tls-ca when the flag is absent."),
    ("COORD_TLS_CERT", "--coord-tls-cert when the flag is absent."),
    ("COORD_TLS_KEY", "--coord-tls-key when the flag is absent."),
    (
        "COORD_TLS_SERVER_NAME",
        "--coord-tls-server-name when the flag is absent.",
    ),
    ("COORD_NATS_CREDS", "--nats-creds when the flag is absent."),
    (
        "COORD_NATS_NKEY_FILE",
        "--nats-nkey-file when the flag is absent.",
    ),
    (
        "RUST_LOG",
        "Which of the library's log records reach stderr (default warn), e.g. info or fleetcoord=debug.",
    ),
    (
        "NOTIFY_SOCKET",
        "Set by systemd for Type=notify units: agent, elect, lock and watch-hosts report READY=1 once registered, leading, holding the lock or synced, and STOPPING=1 at the end.",
    ),
    (
        "WATCHDOG_USEC",
        "Set by systemd with WatchdogSec=: the long-running commands send WATCHDOG=1 each time their lease is renewed.",
    ),
    (
        "WATCHDOG_PID",
        "Set by systemd with WATCHDOG_USEC: the watchdog is for this process only if it names its pid.",
    ),
];

/// Every exit status the tool uses, with what it means: the man pages'
/// EXIT STATUS section, and what the README's CLI section must agree with
/// (a test compares them).
pub const EXIT_STATUSES: [(&str, &str); 6] = [
    (
        "0",
        "Success. Also when SIGINT, SIGTERM or SIGHUP stopped a long-running command, which then cleaned up (an agent revokes its lease, a leader resigns); with -- CMD, when CMD obeyed the SIGTERM passed on to it (it exited 0 or died of it).",
    ),
    (
        "1",
        "A runtime error: etcd or the backend unreachable or not an etcd server, a lease lost (with a hint naming --restart), a refused hand-over. The message is one line on stderr.",
    ),
    (
        "2",
        "A usage error: an unknown flag, a missing argument, a value that cannot be used (a name with '/', an empty name, a port out of range, a prefix without its '/'). Every name, prefix and key is checked before connecting, so this comes first whether etcd is up or not.",
    ),
    (
        "3",
        "Nothing there: leader with no leader, kv get of a key that is not set, shards NAME with no shard owned (the answer is printed all the same: no leader; null in --json); or kv set --if-revision found the key at another revision (or, for 0, set), wrote nothing, and names the key's revision.",
    ),
    (
        "130",
        "A second SIGINT, SIGTERM or SIGHUP while cleaning up: exit at once, without cleanup (leases expire after their TTL).",
    ),
    (
        "N",
        "elect, lock and shards join with -- CMD: CMD's own exit status when it exited by itself, or when it did not stop cleanly after a signal (137 when SIGKILLed after --kill-grace); 128 plus the signal's number if a signal killed it.",
    ),
];

/// Examples per page, keyed by the page's name; (command, what it does).
const EXAMPLES: [(&str, &[(&str, &str)]); 11] = [
    (
        "fleetcoord",
        &[
            ("fleetcoord hosts", "List the live hosts and their metadata."),
            (
                "fleetcoord agent --host-id $(uuidgen) --meta '{\"zone\":\"a\"}' --ttl 5s",
                "Register this shell's host until Ctrl-C.",
            ),
            (
                "fleetcoord elect scheduler -- ./run-scheduler",
                "Run a command only while leading the election scheduler.",
            ),
            (
                "fleetcoord --json watch-hosts",
                "Stream host events as JSON lines, each with its time in ts.",
            ),
            (
                "fleetcoord man --all /usr/local/share/man/man1",
                "Install every manual page.",
            ),
        ],
    ),
    (
        "fleetcoord-elect",
        &[
            (
                "fleetcoord elect scheduler --value host-a",
                "Campaign; print the fencing token once leading; resign on Ctrl-C.",
            ),
            (
                "fleetcoord elect scheduler --restart -- ./run-scheduler",
                "Run the command while leading; campaign again whenever it ends.",
            ),
            (
                "fleetcoord elect --prefix '' jobs",
                "Queue behind `etcdctl elect jobs`, in the same election.",
            ),
        ],
    ),
    (
        "fleetcoord-elect-hand-over",
        &[(
            "fleetcoord elect hand-over scheduler --to host-b",
            "Ask the leader of scheduler to hand over to host-b; fails at once with the leader's reason if it refuses.",
        )],
    ),
    (
        "fleetcoord-leader",
        &[
            ("fleetcoord leader scheduler", "Print the current leader."),
            (
                "fleetcoord leader --prefix '' jobs",
                "Print the leader of `etcdctl elect jobs`.",
            ),
        ],
    ),
    (
        "fleetcoord-observe",
        &[(
            "fleetcoord --timestamps observe scheduler",
            "Print the leader, then every change, each line with its time.",
        )],
    ),
    (
        "fleetcoord-lock",
        &[
            (
                "fleetcoord lock nightly-backup -- ./backup.sh",
                "Run the backup under a fenced lock.",
            ),
            (
                "fleetcoord lock --permits 2 uploads -- ./upload.sh",
                "At most two uploads at once.",
            ),
            (
                "fleetcoord lock --read catalog -- ./serve-reports.sh",
                "Read under a shared lock: readers run together, never beside a writer.",
            ),
            (
                "fleetcoord lock --write catalog -- ./rebuild-catalog.sh",
                "Rebuild alone: waits for the readers ahead, and readers that come later wait for it.",
            ),
        ],
    ),
    (
        "fleetcoord-barrier",
        &[
            (
                "fleetcoord barrier nightly-batch --count 3 -- ./batch-step.sh",
                "Start the step once all three hosts arrived; exit once all three finished it.",
            ),
            (
                "fleetcoord barrier deploy-wave --count 5",
                "A rendezvous: return once five processes arrived and all passed.",
            ),
        ],
    ),
    (
        "fleetcoord-watch-hosts",
        &[(
            "fleetcoord --timestamps watch-hosts",
            "Print Up, Updated and Down (left or expired) as they happen, each line with its time.",
        )],
    ),
    (
        "fleetcoord-kv-watch",
        &[(
            "fleetcoord kv watch config 'roll*'",
            "Print the matching keys, SYNCED, then every change.",
        )],
    ),
    (
        "fleetcoord-sub",
        &[(
            "fleetcoord --json sub deploys --count 1",
            "Wait for the next message on deploys, print it as JSON, exit.",
        )],
    ),
    (
        "fleetcoord-stream-read",
        &[(
            "fleetcoord stream read audit --from start",
            "Replay the stream audit, then follow it.",
        )],
    ),
];

/// The command tree as the pages show it: built (so every subcommand has
/// its page name, `fleetcoord-kv-get`), without clap's `help`
/// subcommands, which have no page.
fn tree(root: clap::Command) -> clap::Command {
    fn strip(cmd: clap::Command) -> clap::Command {
        let names: Vec<String> = cmd
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        names.into_iter().fold(cmd, |cmd, name| {
            cmd.mut_subcommand(name, |sub| strip(sub.disable_help_subcommand(true)))
        })
    }
    let mut root = strip(root.disable_help_subcommand(true));
    root.build();
    root
}

/// Every page: the root's, then each subcommand's, depth first.
fn all_pages(root: &clap::Command) -> Vec<clap::Command> {
    fn walk(cmd: &clap::Command, pages: &mut Vec<clap::Command>) {
        pages.push(cmd.clone());
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, pages);
        }
    }
    let mut pages = Vec::new();
    walk(root, &mut pages);
    pages
}

/// The page's name: `fleetcoord`, `fleetcoord-elect`, `fleetcoord-kv-get`.
fn page_name(cmd: &clap::Command) -> String {
    cmd.get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string()
}

/// The sections clap_mangen does not write, for the page `cmd`.
fn extra_sections(cmd: &clap::Command, root: bool) -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for (status, meaning) in EXIT_STATUSES {
        roff.control("TP", []);
        roff.text([bold(status)]);
        roff.text([roman(meaning)]);
    }
    if root {
        roff.control("SH", ["ENVIRONMENT"]);
        for (name, meaning) in ENVIRONMENT {
            roff.control("TP", []);
            roff.text([bold(name)]);
            roff.text([roman(meaning)]);
        }
    }
    let name = page_name(cmd);
    if let Some((_, examples)) = EXAMPLES.iter().find(|(page, _)| *page == name) {
        roff.control("SH", ["EXAMPLES"]);
        for (command, meaning) in examples.iter() {
            roff.control("TP", []);
            roff.text([bold(*command)]);
            roff.text([roman(*meaning)]);
        }
    }
    roff.control("SH", ["SEE ALSO"]);
    let see_also = if root {
        "etcdctl(1)".to_string()
    } else {
        "fleetcoord(1), etcdctl(1)".to_string()
    };
    roff.text([roman(see_also)]);
    roff
}

/// `[--name VALUE]` for an option (without the brackets when required),
/// in the synopsis' roff.
fn option_usage(arg: &clap::Arg) -> Vec<Inline> {
    let (open, close) = if arg.is_required_set() {
        ("", "")
    } else {
        ("[", "]")
    };
    let mut words = vec![roman(open)];
    match (arg.get_long(), arg.get_short()) {
        (Some(long), _) => words.push(bold(format!("--{long}"))),
        (None, Some(short)) => words.push(bold(format!("-{short}"))),
        (None, None) => words.push(bold(arg.get_id().to_string())),
    }
    if arg.get_action().takes_values() {
        let value = arg
            .get_value_names()
            .and_then(|names| names.first())
            .map_or_else(
                || arg.get_id().to_string().to_uppercase(),
                |n| n.to_string(),
            );
        words.push(roman(" "));
        words.push(italic(value));
    }
    words.push(roman(close));
    words
}

/// The SYNOPSIS of `cmd`'s page: `fleetcoord [GLOBAL OPTIONS] WORDS`
/// with the command's own options and arguments, then, apart, the global
/// options every command takes. clap_mangen lists them all in one run,
/// the global ones interleaved with the command's own, which hides what
/// the command itself takes.
fn synopsis(cmd: &clap::Command) -> Roff {
    let bin = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    let words = bin.strip_prefix("fleetcoord").unwrap_or(bin).trim();
    let shown = |arg: &&clap::Arg| {
        !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
    };
    let mut line = vec![
        bold("fleetcoord"),
        roman(" ["),
        italic("GLOBAL OPTIONS"),
        roman("]"),
    ];
    if !words.is_empty() {
        line.push(roman(" "));
        line.push(bold(words.to_string()));
    }
    let head = line.clone();
    for arg in cmd
        .get_arguments()
        .filter(shown)
        .filter(|a| !a.is_positional() && !a.is_global_set())
    {
        line.push(roman(" "));
        line.extend(option_usage(arg));
    }
    for arg in cmd.get_positionals().filter(shown) {
        let name = arg
            .get_value_names()
            .and_then(|names| names.first())
            .map_or_else(
                || arg.get_id().to_string().to_uppercase(),
                |n| n.to_string(),
            );
        let many = if arg.get_num_args().is_some_and(|n| n.max_values() > 1) {
            "..."
        } else {
            ""
        };
        line.push(roman(" "));
        if arg.is_last_set() {
            line.push(roman("[-- "));
            line.push(italic(name));
            line.push(roman(format!("{many}]")));
        } else if arg.is_required_set() {
            line.push(italic(format!("{name}{many}")));
        } else {
            line.push(roman("["));
            line.push(italic(format!("{name}{many}")));
            line.push(roman("]"));
        }
    }
    let mut roff = Roff::new();
    roff.control("SH", ["SYNOPSIS"]);
    let has_subcommands = cmd.get_subcommands().next().is_some();
    if !has_subcommands || cmd.get_positionals().next().is_some() || words.is_empty() {
        if words.is_empty() {
            line.push(roman(" "));
            line.push(italic("COMMAND"));
        }
        roff.text(line);
    }
    if has_subcommands && !words.is_empty() {
        if cmd.get_positionals().next().is_some() {
            roff.control("br", []);
        }
        let mut line = head;
        line.push(roman(" "));
        line.push(italic("COMMAND"));
        roff.text(line);
    }
    roff.control("PP", []);
    let mut global = vec![italic("GLOBAL OPTIONS"), roman(":")];
    for arg in cmd
        .get_arguments()
        .filter(shown)
        .filter(|a| !a.is_positional() && (a.is_global_set() || words.is_empty()))
    {
        global.push(roman(" "));
        global.extend(option_usage(arg));
    }
    roff.text(global);
    roff
}

/// One page in roff: clap_mangen's sections, then [`extra_sections`]
/// before its VERSION section.
fn render(cmd: &clap::Command, root: bool) -> Result<String, CliError> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .source(concat!("fleetcoord ", env!("CARGO_PKG_VERSION")))
        .render(&mut page)
        .map_err(|e| CliError::Message(format!("cannot render the man page: {e}")))?;
    let page = String::from_utf8_lossy(&page).into_owned();
    // Each rendering starts with the same preamble (roff strings for
    // apostrophes); the page has it once already.
    let preamble = Roff::new().render();
    let extra = extra_sections(cmd, root).render();
    let extra = extra.strip_prefix(&preamble).unwrap_or(&extra);
    // clap_mangen's SYNOPSIS, replaced by ours (global options apart).
    let page = match (page.find(".SH SYNOPSIS\n"), page.find(".SH DESCRIPTION")) {
        (Some(from), Some(to)) if from < to => {
            let ours = synopsis(cmd).render();
            let ours = ours.strip_prefix(&preamble).unwrap_or(&ours);
            format!("{}{ours}{}", &page[..from], &page[to..])
        }
        _ => page,
    };
    Ok(match page.find(".SH VERSION") {
        Some(at) => format!("{}{extra}{}", &page[..at], &page[at..]),
        None => format!("{page}{extra}"),
    })
}

/// `man`: the page asked for, on stdout; or with `--all DIR` every page
/// into DIR, printing each file's path.
pub fn man(root: clap::Command, args: &ManArgs) -> Result<Vec<u8>, CliError> {
    let root = tree(root);
    if let Some(dir) = &args.all {
        let mut written = String::new();
        for page in all_pages(&root) {
            let path = dir.join(format!("{}.1", page_name(&page)));
            let text = render(&page, page_name(&page) == page_name(&root))?;
            std::fs::write(&path, text)
                .map_err(|e| CliError::Message(format!("cannot write {}: {e}", path.display())))?;
            written.push_str(&format!("{}\n", path.display()));
        }
        return Ok(written.into_bytes());
    }
    let mut cmd = &root;
    for word in &args.subcommand {
        cmd = cmd.find_subcommand(word).ok_or_else(|| {
            CliError::Usage(format!(
                "no page for {:?}: {} has no subcommand {word:?}",
                args.subcommand.join(" "),
                page_name(cmd)
            ))
        })?;
    }
    Ok(render(cmd, args.subcommand.is_empty())?.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::ENVIRONMENT;

    /// The sources, for the check below; a new file joins the list.
    const SOURCES: [&str; 17] = [
        include_str!("barrier.rs"),
        include_str!("bus.rs"),
        include_str!("duration.rs"),
        include_str!("election.rs"),
        include_str!("follow.rs"),
        include_str!("gated.rs"),
        include_str!("hosts.rs"),
        include_str!("lock.rs"),
        include_str!("main.rs"),
        include_str!("man.rs"),
        include_str!("metrics_http.rs"),
        include_str!("notify.rs"),
        include_str!("output.rs"),
        include_str!("security.rs"),
        include_str!("shards.rs"),
        include_str!("signal.rs"),
        include_str!("tether.rs"),
    ];

    /// Every quoted name of a variable family the tool reads (etcd's,
    /// etcdctl's, the backends', systemd's) is documented, so ENVIRONMENT
    /// cannot fall behind the code.
    #[test]
    fn every_variable_the_sources_name_is_documented() {
        let families = [
            "ETCD_",
            "ETCDCTL_",
            "COORD",
            "NOTIFY_",
            "WATCHDOG_",
            "RUST_LOG",
        ];
        let mut named = 0;
        for source in SOURCES {
            // Every "NAME" in the text: a run of A-Z, 0-9 and _ between
            // two double quotes.
            let bytes = source.as_bytes();
            for (at, _) in source.match_indices('"') {
                let name: String = source[at + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let closed = bytes.get(at + 1 + name.len()) == Some(&b'"');
                let is_variable =
                    closed && families.iter().any(|f| name.starts_with(f)) && !name.ends_with('_');
                if is_variable {
                    named += 1;
                    assert!(
                        ENVIRONMENT.iter().any(|(known, _)| *known == name),
                        "{name} is read but not in ENVIRONMENT"
                    );
                }
            }
        }
        assert!(named >= 15, "found only {named} variable names");
    }
}
