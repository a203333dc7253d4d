//! `docs/cli.md`'s table of `balancer run` flags against the command line itself: every flag is
//! listed, with its environment variable and its default, and nothing else is.

use std::collections::BTreeMap;

use balancer::cli::Cli;
use clap::CommandFactory;

use crate::support::repo::repo_file;

/// The table's rows: flag → (env, default) cells.
fn documented() -> BTreeMap<String, (String, String)> {
    let page = repo_file("docs/cli.md");
    let table = page.split("`balancer run` flags:").nth(1).expect("the run flags table");
    let mut rows = BTreeMap::new();
    for line in table.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        if let [flag, env, default, ..] = cells.as_slice()
            && flag.starts_with("`--")
        {
            rows.insert(flag.trim_matches('`').to_string(), (env.to_string(), default.to_string()));
        }
    }
    rows
}

#[test]
fn the_run_flags_table_lists_every_flag_with_its_environment_variable_and_default() {
    let command = Cli::command();
    let run = command.find_subcommand("run").expect("a run command");
    let mut documented = documented();
    let mut problems = Vec::new();
    for arg in run.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" {
            continue;
        }
        let flag = format!("--{long}");
        let Some((env, default)) = documented.remove(&flag) else {
            problems.push(format!("{flag} is not in the table"));
            continue;
        };
        let want_env = arg.get_env().map(|e| format!("`{}`", e.to_string_lossy()));
        if let Some(want_env) = want_env
            && !env.starts_with(&want_env)
        {
            problems.push(format!("{flag}: env {env}, but the command line reads {want_env}"));
        }
        for value in arg.get_default_values() {
            let want = format!("`{}`", value.to_string_lossy());
            if !default.contains(&want) {
                problems.push(format!("{flag}: default {default}, but the command line's is {want}"));
            }
        }
    }
    problems.extend(documented.keys().map(|flag| format!("{flag} is documented but not a flag of balancer run")));
    assert!(problems.is_empty(), "docs/cli.md disagrees with the command line:\n{}", problems.join("\n"));
}
