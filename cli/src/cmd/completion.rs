//! `lattice completion SHELL` and the hidden `lattice __complete KIND` it calls for names.

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;
use serde_json::Value;

use crate::cli::{Cli, CompleteArgs, CompletionArgs};
use crate::cmd::workload::{self, name};
use crate::errors::CliError;
use crate::Ctx;

/// Bash glue: allocation, node, DAG, vCluster and tenant names come from
/// `lattice __complete`, in the tenant typed on the command line (`-t/-n/--tenant`), if any.
const BASH_DYNAMIC: &str = r#"
# Dynamic names (allocations, nodes, DAGs, vClusters, tenants) from the server, in the
# tenant typed on the command line (-t/-n/--tenant), if any.
_lattice_dynamic() {
    local cur prev opt i w cmd="" sub="" pos=0 tenant=""
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    # COMP_WORDBREAKS splits `--tenant=x` into `--tenant` `=` `x`.
    opt="$prev"
    if [[ "$cur" == "=" ]]; then
        cur=""
    elif [[ "$prev" == "=" ]]; then
        opt="${COMP_WORDS[COMP_CWORD-2]}"
    fi
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        case "$w" in
            -n|-t|--tenant|--api-url|--token|--token-file|--config|-o|--output|--vcluster|--certificate-authority)
                [[ "${COMP_WORDS[i+1]}" == "=" ]] && i=$((i + 1))
                i=$((i + 1))
                if [[ $i -lt $COMP_CWORD ]]; then
                    case "$w" in -n|-t|--tenant) tenant="${COMP_WORDS[i]}" ;; esac
                fi
                continue ;;
            -[nt]?*) tenant="${w:2}"; tenant="${tenant#=}"; continue ;;
            -*) continue ;;
        esac
        if [[ -z "$cmd" ]]; then cmd="$w"
        elif [[ -z "$sub" ]]; then sub="$w"
        fi
        pos=$((pos + 1))
    done
    # As typed: drop shell quoting (tenant names have no quotes or backslashes).
    tenant="${tenant//[\'\"\\]/}"
    local kind=""
    case "$opt" in
        -n|-t|--tenant) kind=tenants ;;
        --vcluster) kind=vclusters ;;
        --node) kind=nodes ;;
        --api-url|--token|--token-file|--config|-o|--output|--certificate-authority) ;;
        *)
            if [[ "$cur" != -* ]]; then
                case "$cmd" in
                    status|cancel|logs|watch|attach) kind=allocations ;;
                    nodes) kind=nodes ;;
                    node) [[ $pos -ge 2 ]] && kind=nodes ;;
                    dag) case "$sub" in status|cancel) [[ $pos -ge 2 ]] && kind=dags ;; esac ;;
                esac
            fi ;;
    esac
    if [[ -n "$kind" ]]; then
        local names
        local -a targs=()
        [[ -n "$tenant" ]] && targs=(--tenant "$tenant")
        names="$("${COMP_WORDS[0]}" __complete "$kind" ${targs[@]+"${targs[@]}"} 2>/dev/null)"
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

/// Zsh glue. clap's `_lattice` is renamed `_lattice_clap` (see [`zsh_script`]) and this
/// `_lattice` wraps it: allocation, node, DAG, vCluster and tenant names come from
/// `lattice __complete` (in the tenant typed with `-t/-n/--tenant`, if any), everything else
/// (subcommands, flags) from clap's function. It works both when the script is sourced and
/// when it is installed as `_lattice` on `$fpath`.
const ZSH_DYNAMIC: &str = r#"
# Dynamic names (allocations, nodes, DAGs, vClusters, tenants) from the server, in the
# tenant typed on the command line (-t/-n/--tenant), if any.
_lattice() {
    local cur="${words[CURRENT]}" prev="${words[CURRENT-1]}" w cmd="" sub="" kind="" tenant=""
    integer i pos=0 skip=0
    for (( i = 2; i < CURRENT; i++ )); do
        w="${words[i]}"
        if (( skip )); then
            (( skip == 2 )) && tenant="${(Q)w}"
            skip=0
            continue
        fi
        case "$w" in
            -n|-t|--tenant) skip=2; continue ;;
            --api-url|--token|--token-file|--config|-o|--output|--vcluster|--certificate-authority)
                skip=1; continue ;;
            --tenant=*) tenant="${(Q)w#--tenant=}"; continue ;;
            -[nt]?*) tenant="${(Q)${w:2}#=}"; continue ;;
            -*) continue ;;
        esac
        if [[ -z "$cmd" ]]; then cmd="$w"
        elif [[ -z "$sub" ]]; then sub="$w"
        fi
        pos+=1
    done
    case "$prev" in
        -n|-t|--tenant) kind=tenants ;;
        --vcluster) kind=vclusters ;;
        --node) kind=nodes ;;
        --api-url|--token|--token-file|--config|-o|--output|--certificate-authority) ;;
        *)
            if [[ "$cur" != -* ]]; then
                case "$cmd" in
                    status|cancel|logs|watch|attach) kind=allocations ;;
                    nodes) kind=nodes ;;
                    node) (( pos >= 2 )) && kind=nodes ;;
                    dag) case "$sub" in status|cancel) (( pos >= 2 )) && kind=dags ;; esac ;;
                esac
            fi ;;
    esac
    if [[ -n "$kind" ]]; then
        local -a names targs
        [[ -n "$tenant" ]] && targs=(--tenant "$tenant")
        names=( ${(f)"$(_call_program lattice-names "${words[1]}" __complete "$kind" "${targs[@]}" 2>/dev/null)"} )
        if (( ${#names} )); then
            compadd -a names && return 0
        fi
    fi
    _lattice_clap "$@"
}
"#;

/// Fish glue. The conditions look at the command words (options skipped), so `status`
/// means `lattice status`, not `lattice node status` or `lattice dag status`. Names are
/// listed in the tenant typed with `-t/-n/--tenant`, if any.
const FISH_DYNAMIC: &str = r#"
# Dynamic names from the server.
# The command words typed so far, without options and the values of the global options
# that take one: `lattice -t x node status n1` -> node status n1.
function __lattice_command_words
    set -l words (commandline -opc)
    set -e words[1]
    set -l skip 0
    for w in $words
        if test $skip = 1
            set skip 0
            continue
        end
        switch $w
            case --api-url --token --token-file -n -t --tenant --config -o --output --vcluster --certificate-authority
                set skip 1
            case '-*'
            case '*'
                echo $w
        end
    end
end

# `--tenant TENANT` (two lines) when the command line names a tenant (-t/-n/--tenant), for
# `lattice __complete`; nothing otherwise.
function __lattice_tenant_args
    set -l words (commandline -opc)
    set -e words[1]
    set -l tenant
    set -l skip 0
    for w in $words
        if test $skip = 2
            set tenant $w
        end
        if test $skip != 0
            set skip 0
            continue
        end
        switch $w
            case -n -t --tenant
                set skip 2
            case --api-url --token --token-file --config -o --output --vcluster --certificate-authority
                set skip 1
            case '--tenant=*'
                set tenant (string replace -- '--tenant=' '' $w)
            case '--*'
            case '-n*' '-t*'
                set tenant (string sub -s 3 -- $w | string replace -r '^=' '')
        end
    end
    if test -n "$tenant"
        printf '%s\n' --tenant $tenant
    end
end

# Which names the next word takes: allocations, nodes or dags (none: exit 1).
function __lattice_dynamic_kind
    set -l w (__lattice_command_words)
    switch "$w[1]"
        case status cancel logs watch attach
            echo allocations
        case nodes
            echo nodes
        case node
            if set -q w[2]; and contains -- $w[2] drain undrain disable enable status
                echo nodes
                return 0
            end
            return 1
        case dag
            if set -q w[2]; and contains -- $w[2] status cancel
                echo dags
                return 0
            end
            return 1
        case '*'
            return 1
    end
end

# True when the next word takes names of kind $argv[1].
function __lattice_wants
    test (__lattice_dynamic_kind; or echo none) = $argv[1]
end

# True when the command (first command word) is $argv[1].
function __lattice_command_is
    set -l w (__lattice_command_words)
    test "$w[1]" = "$argv[1]"
end

complete -c lattice -n '__lattice_wants allocations' -f -a '(lattice __complete allocations (__lattice_tenant_args) 2>/dev/null)'
complete -c lattice -n '__lattice_wants nodes' -f -a '(lattice __complete nodes 2>/dev/null)'
complete -c lattice -n '__lattice_wants dags' -f -a '(lattice __complete dags (__lattice_tenant_args) 2>/dev/null)'
complete -c lattice -n '__lattice_command_is logs' -l node -r -f -a '(lattice __complete nodes 2>/dev/null)'
complete -c lattice -n '__lattice_command_is attach' -l node -r -f -a '(lattice __complete nodes 2>/dev/null)'
complete -c lattice -l vcluster -r -f -a '(lattice __complete vclusters (__lattice_tenant_args) 2>/dev/null)'
complete -c lattice -s n -s t -l tenant -r -f -a '(lattice __complete tenants 2>/dev/null)'
"#;

/// How clap's zsh script starts its main function.
const ZSH_CLAP_MAIN: &str = "\n_lattice() {\n";
/// How clap's zsh script ends: call `_lattice` when autoloaded, else `compdef` it.
const ZSH_CLAP_TAIL: &str = "\nif [ \"$funcstack[1]\" = \"_lattice\" ]";

/// clap's zsh script with its `_lattice` renamed `_lattice_clap`, and [`ZSH_DYNAMIC`]'s
/// `_lattice` inserted before the script's final dispatch (`_lattice "$@"` when autoloaded
/// from `$fpath`, `compdef _lattice lattice` when sourced).
pub fn zsh_script(generated: &str) -> String {
    let renamed = generated.replacen(ZSH_CLAP_MAIN, "\n_lattice_clap() {\n", 1);
    let dynamic = ZSH_DYNAMIC.trim_start_matches('\n');
    match renamed.rfind(ZSH_CLAP_TAIL) {
        Some(at) => format!("{}\n{dynamic}{}", &renamed[..at], &renamed[at..]),
        None => format!("{renamed}\n{dynamic}\ncompdef _lattice lattice\n"),
    }
}

/// Runs `completion SHELL`.
pub fn run(args: &CompletionArgs, out: &mut dyn Write) -> Result<i32, CliError> {
    let mut cmd = Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "lattice", &mut buf);
    match args.shell {
        Shell::Zsh => out.write_all(zsh_script(&String::from_utf8_lossy(&buf)).as_bytes())?,
        Shell::Bash => {
            out.write_all(&buf)?;
            out.write_all(BASH_DYNAMIC.as_bytes())?;
        }
        Shell::Fish => {
            out.write_all(&buf)?;
            out.write_all(FISH_DYNAMIC.as_bytes())?;
        }
        _ => out.write_all(&buf)?,
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
