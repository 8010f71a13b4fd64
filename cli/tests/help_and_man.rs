//! The tool's own documentation: each subcommand's `--help` lists its own
//! options before the global ones, and `fleetcoord man` produces every
//! page it refers to, each with the sections a man page is read for.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::collections::BTreeSet;
use support::{cli, stderr, stdout};

fn help(args: &[&str]) -> String {
    let output = cli().args(args).arg("--help").output().expect("spawn");
    assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    stdout(&output)
}

/// Where `heading` starts in `text`, as a line of its own.
fn heading(text: &str, heading: &str) -> usize {
    text.find(&format!("\n{heading}:\n"))
        .unwrap_or_else(|| panic!("no {heading:?} heading in:\n{text}"))
}

#[test]
fn each_subcommand_lists_its_own_options_before_the_global_ones() {
    // (subcommand, one of its own options)
    let cases: &[(&[&str], &str)] = &[
        (&["elect"], "--priority"),
        (&["elect", "hand-over"], "--to"),
        (&["leader"], "--prefix"),
        (&["observe"], "--count"),
        (&["lock"], "--permits"),
        (&["barrier"], "--count"),
        (&["agent"], "--host-id"),
        (&["watch-hosts"], "--prefix"),
        (&["kv", "watch"], "--count"),
        (&["stream", "read"], "--from"),
        (&["sub"], "--count"),
    ];
    for (args, own) in cases {
        let text = help(args);
        let options = heading(&text, "Options");
        let global = heading(&text, "Global options");
        assert!(options < global, "{args:?}: global options first:\n{text}");
        let (mine, theirs) = text.split_at(global);
        assert!(mine.contains(own), "{args:?}: {own} not above the globals");
        for flag in [
            "--endpoints",
            "--json",
            "--timestamps",
            "--cacert",
            "--coord ",
        ] {
            assert!(!mine.contains(flag), "{args:?}: {flag} among its own");
            assert!(theirs.contains(flag), "{args:?}: {flag} not under globals");
        }
    }
}

/// `fleetcoord man WORDS...`, which must succeed.
fn page(words: &[String]) -> String {
    let output = cli().arg("man").args(words).output().expect("spawn");
    assert!(
        output.status.success(),
        "man {words:?}: {}",
        stderr(&output)
    );
    stdout(&output)
}

/// The section headings of a page (`.SH NAME`, `.SH "EXIT STATUS"`).
fn sections(page: &str) -> Vec<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix(".SH "))
        .map(|s| s.trim_matches('"').to_string())
        .collect()
}

/// The pages a page's SUBCOMMANDS section refers to, as page names
/// (`fleetcoord-kv-get`).
fn referenced(page: &str) -> Vec<String> {
    page.lines()
        .skip_while(|l| *l != ".SH SUBCOMMANDS")
        .skip(1)
        .take_while(|l| !l.starts_with(".SH"))
        .filter_map(|l| l.strip_suffix("(1)"))
        .map(|name| name.replace("\\-", "-"))
        .collect()
}

#[test]
fn man_produces_every_page_it_refers_to_with_its_sections() {
    let root = page(&[]);
    for section in ["EXIT STATUS", "ENVIRONMENT", "EXAMPLES", "SEE ALSO"] {
        assert!(
            sections(&root).iter().any(|s| s == section),
            "fleetcoord(1) has no {section}: {:?}",
            sections(&root)
        );
    }
    for variable in [
        "ETCD_ENDPOINTS",
        "ETCDCTL_ENDPOINTS",
        "ETCDCTL_CACERT",
        "ETCDCTL_PASSWORD",
        "COORD",
        "COORD_URL",
        "COORD_TLS_CA",
        "COORD_NATS_CREDS",
        "RUST_LOG",
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
    ] {
        assert!(
            root.contains(&format!("\\fB{variable}\\fR")),
            "ENVIRONMENT lacks {variable}"
        );
    }
    // Walk the references from the root page: each one must render, under
    // its own name, with the sections of every page.
    let mut queue = vec![(Vec::<String>::new(), "fleetcoord".to_string(), root)];
    let mut seen = BTreeSet::new();
    while let Some((words, name, text)) = queue.pop() {
        assert!(
            text.contains(&format!(".TH {name} 1")),
            "man {words:?} is not {name}(1):\n{text:.300}"
        );
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "SEE ALSO"] {
            assert!(
                sections(&text).iter().any(|s| s == section),
                "{name}(1) has no {section}: {:?}",
                sections(&text)
            );
        }
        seen.insert(name.clone());
        for child in referenced(&text) {
            let word = child
                .strip_prefix(&format!("{name}-"))
                .unwrap_or_else(|| panic!("{name}(1) refers to {child}(1), not one of its own"));
            let mut child_words = words.clone();
            child_words.push(word.to_string());
            let child_text = page(&child_words);
            queue.push((child_words, child, child_text));
        }
    }
    for expected in [
        "fleetcoord-elect",
        "fleetcoord-elect-hand-over",
        "fleetcoord-watch-hosts",
        "fleetcoord-kv-get",
        "fleetcoord-stream-read",
        "fleetcoord-man",
    ] {
        assert!(seen.contains(expected), "{expected} never referred to");
    }
    assert!(!seen.iter().any(|n| n.ends_with("-help")), "{seen:?}");

    // --all writes exactly those pages, each as `man WORDS` prints it.
    let dir = std::env::temp_dir().join(format!("fleetcoord-man-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let output = cli()
        .args(["man", "--all"])
        .arg(&dir)
        .output()
        .expect("spawn");
    assert!(output.status.success(), "{}", stderr(&output));
    let written: BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("read dir")
        .map(|e| {
            let name = e.expect("entry").file_name().into_string().expect("utf-8");
            name.strip_suffix(".1").expect("a .1 file").to_string()
        })
        .collect();
    assert_eq!(written, seen);
    assert_eq!(stdout(&output).lines().count(), seen.len());
    let elect = std::fs::read_to_string(dir.join("fleetcoord-elect.1")).expect("read");
    assert_eq!(elect, page(&["elect".to_string()]));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn every_argument_says_what_it_is() {
    for args in [
        &["pub"][..],
        &["sub"],
        &["stream", "append"],
        &["stream", "read"],
        &["kv", "get"],
        &["kv", "set"],
        &["kv", "del"],
        &["kv", "watch"],
        &["elect"],
        &["elect", "hand-over"],
        &["leader"],
        &["observe"],
        &["lock"],
        &["barrier"],
        &["completions"],
        &["man"],
    ] {
        let text = help(args);
        let arguments: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != "Arguments:")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert!(!arguments.is_empty(), "{args:?}: no arguments:\n{text}");
        for line in arguments {
            // `  <NAME>  What it is`: a name, then a description.
            let described = line
                .trim_start()
                .split_once("  ")
                .is_some_and(|(_, about)| !about.trim().is_empty());
            assert!(described, "{args:?}: {line:?} has no description");
        }
    }
}

/// The lines of `page`'s section `name`, roff escapes for '-' undone.
fn section(page: &str, name: &str) -> Vec<String> {
    page.lines()
        .skip_while(|l| l.trim_start_matches(".SH ").trim_matches('"') != name)
        .skip(1)
        .take_while(|l| !l.starts_with(".SH"))
        .map(|l| l.replace("\\-", "-"))
        .collect()
}

#[test]
fn the_synopsis_keeps_global_options_apart_from_the_commands_own() {
    // (page words, one of its own options, one of its arguments)
    let cases: &[(&[&str], &str, &str)] = &[
        (&["elect"], "--priority", "NAME"),
        (&["lock"], "--permits", "NAME"),
        (&["shards", "join"], "--shards", "CMD"),
        (&["kv", "watch"], "--count", "BUCKET"),
    ];
    for (words, own, argument) in cases {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        let synopsis = section(&page(&words), "SYNOPSIS");
        let (global, local): (Vec<String>, Vec<String>) = synopsis
            .into_iter()
            .filter(|l| !l.starts_with('.'))
            .partition(|l| l.starts_with("\\fIGLOBAL OPTIONS\\fR:"));
        let (global, local) = (global.join(" "), local.join(" "));
        assert!(local.contains(own), "{words:?}: {own} not in {local}");
        assert!(
            local.contains(argument),
            "{words:?}: {argument} not in {local}"
        );
        for flag in ["--endpoints", "--json", "--cacert", "--connect-timeout"] {
            assert!(
                !local.contains(flag),
                "{words:?}: {flag} among its own: {local}"
            );
            assert!(
                global.contains(flag),
                "{words:?}: {flag} not global: {global}"
            );
        }
        assert!(!global.contains(own), "{words:?}: {own} listed as global");
    }
}

#[test]
fn the_readme_and_the_man_page_list_the_same_exit_statuses() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let in_readme: BTreeSet<String> = readme
        .lines()
        .skip_while(|l| !l.starts_with("Exit status (also in `fleetcoord man`"))
        // The heading, a blank line, the header row, the rule.
        .skip(4)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('|').nth(1))
        .map(|status| status.trim().to_string())
        .collect();
    let man = section(&page(&[]), "EXIT STATUS");
    let in_man: BTreeSet<String> = man
        .iter()
        .filter_map(|l| l.strip_prefix("\\fB")?.strip_suffix("\\fR"))
        .map(str::to_string)
        .collect();
    assert!(in_man.contains("3") && in_man.contains("130"), "{in_man:?}");
    assert_eq!(in_readme, in_man, "README table vs man page");
}

#[test]
fn shards_join_documents_that_cmd_restarts_on_every_change() {
    let text = help(&["shards", "join"]);
    assert!(
        text.contains("Restart policy: CMD is restarted whole on every change of the owned set"),
        "{text}"
    );
    let page = page(&["shards".to_string(), "join".to_string()]);
    assert!(page.contains("Restart policy"), "the man page too");
}
