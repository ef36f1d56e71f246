//! `lattice completion SHELL` and the hidden `lattice __complete KIND` it calls for names.

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;
use serde_json::Value;

use crate::cli::{Cli, CompleteArgs, CompletionArgs};
use crate::cmd::workload::{self, name};
use crate::errors::CliError;
use crate::Ctx;

/// Bash glue: allocation, node, DAG and vCluster names come from `lattice __complete`.
const BASH_DYNAMIC: &str = r#"
# Dynamic names (allocations, nodes, DAGs, vClusters) from the server.
_lattice_dynamic() {
    local cur prev i w cmd="" sub="" pos=0
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        case "$w" in
            --api-url|--token|--token-file|-n|-t|--tenant|--config|-o|--output|--vcluster|--certificate-authority)
                i=$((i + 1)); continue ;;
            -*) continue ;;
        esac
        if [[ -z "$cmd" ]]; then cmd="$w"
        elif [[ -z "$sub" ]]; then sub="$w"
        fi
        pos=$((pos + 1))
    done
    local kind=""
    if [[ "$prev" == "--vcluster" ]]; then
        kind=vclusters
    elif [[ "$prev" == "--node" ]]; then
        kind=nodes
    elif [[ "$cur" != -* ]]; then
        case "$cmd" in
            status|cancel|logs|watch) kind=allocations ;;
            nodes) kind=nodes ;;
            node) [[ $pos -ge 2 ]] && kind=nodes ;;
            dag) case "$sub" in status|cancel) [[ $pos -ge 2 ]] && kind=dags ;; esac ;;
        esac
    fi
    if [[ -n "$kind" ]]; then
        local names
        names="$("${COMP_WORDS[0]}" __complete "$kind" 2>/dev/null)"
        COMPREPLY=( $(compgen -W "$names" -- "$cur") )
        if [[ ${#COMPREPLY[@]} -gt 0 ]]; then
            return 0
        fi
    fi
    _lattice "$@"
}
if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _lattice_dynamic -o nosort -o bashdefault -o default lattice
else
    complete -F _lattice_dynamic -o bashdefault -o default lattice
fi
"#;

const FISH_DYNAMIC: &str = r#"
# Dynamic names from the server.
complete -c lattice -n '__fish_seen_subcommand_from status cancel logs watch' -f -a '(lattice __complete allocations 2>/dev/null)'
complete -c lattice -n '__fish_seen_subcommand_from nodes drain undrain disable enable' -f -a '(lattice __complete nodes 2>/dev/null)'
complete -c lattice -l vcluster -f -a '(lattice __complete vclusters 2>/dev/null)'
"#;

/// Runs `completion SHELL`.
pub fn run(args: &CompletionArgs, out: &mut dyn Write) -> Result<i32, CliError> {
    let mut cmd = Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "lattice", &mut buf);
    out.write_all(&buf)?;
    match args.shell {
        Shell::Bash => out.write_all(BASH_DYNAMIC.as_bytes())?,
        Shell::Fish => out.write_all(FISH_DYNAMIC.as_bytes())?,
        _ => {}
    }
    Ok(0)
}

/// Runs `__complete KIND`: one name per line; silent on errors (exit 1).
pub async fn complete(
    ctx: &mut Ctx,
    args: &CompleteArgs,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let (plural, tenant) = match args.kind.as_str() {
        "allocations" | "allocation" | "alloc" => ("allocations", Some(ctx.tenant.clone())),
        "nodes" | "node" => ("nodes", None),
        "vclusters" | "vcluster" => ("vclusters", Some(ctx.tenant.clone())),
        "dags" | "dag" => ("dags", Some(ctx.tenant.clone())),
        "tenants" | "tenant" => ("tenants", None),
        _ => return Ok(1),
    };
    let fut = workload::list_items(ctx, plural, tenant.as_deref());
    let items: Vec<Value> = match tokio::time::timeout(std::time::Duration::from_secs(3), fut).await
    {
        Ok(Ok(v)) => v,
        _ => return Ok(1),
    };
    let mut names: Vec<&str> = items.iter().map(name).filter(|n| !n.is_empty()).collect();
    names.sort();
    names.dedup();
    for n in names {
        writeln!(out, "{n}")?;
    }
    Ok(0)
}
