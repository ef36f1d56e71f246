//! sbatch's directive rules: which lines count, where the header ends,
//! comments, quoting, short/long forms and abbreviations.

use lattice_compat::directives::{parse_args, scan_script, tokenize_directive, Dialect};
use lattice_compat::{Source, SubmitError};

fn opts(script: &str) -> Vec<(String, Option<String>)> {
    scan_script(script)
        .unwrap()
        .options
        .into_iter()
        .map(|o| (o.name, o.value))
        .collect()
}

fn o(n: &str, v: &str) -> (String, Option<String>) {
    (n.to_string(), Some(v.to_string()))
}

#[test]
fn only_column_zero_magic_words_count() {
    let s = "#!/bin/bash\n#SBATCH -N 2\n# SBATCH -N 3\n  #SBATCH -N 4\n#sbatch -N 5\n##SBATCH -N 6\n#SBATCH --time=10\n";
    assert_eq!(opts(s), vec![o("nodes", "2"), o("time", "10")]);
}

#[test]
fn header_ends_at_first_command() {
    let s = "#!/bin/bash\n\n# comment\n#SBATCH -N 2\n   \n\t# indented comment\n#SBATCH -t 5\necho hi\n#SBATCH -N 9\n";
    let d = scan_script(s).unwrap();
    let v: Vec<_> = d
        .options
        .iter()
        .map(|o| (o.name.as_str(), o.value.as_deref()))
        .collect();
    assert_eq!(v, vec![("nodes", Some("2")), ("time", Some("5"))]);
    assert_eq!(d.first_command_line, Some(8));
    assert_eq!(d.warnings.len(), 1, "late directive warned");
    assert!(
        d.warnings[0].message.contains("line(s) 9"),
        "{}",
        d.warnings[0]
    );
}

#[test]
fn no_shebang_still_parses() {
    assert_eq!(opts("#SBATCH -N 3\nhostname\n"), vec![o("nodes", "3")]);
}

#[test]
fn trailing_comments_and_quotes() {
    assert_eq!(
        opts("#SBATCH --job-name=\"my job\" # the name\n"),
        vec![o("job-name", "my job")]
    );
    assert_eq!(
        opts("#SBATCH --job-name='a # b'\n"),
        vec![o("job-name", "a # b")]
    );
    assert_eq!(
        opts("#SBATCH --job-name=a\\ b\n"),
        vec![o("job-name", "a b")]
    );
    assert_eq!(opts("#SBATCH -J x#comment\n"), vec![o("job-name", "x")]);
    assert_eq!(
        opts("#SBATCH --comment=\"say \\\"hi\\\"\"\n"),
        vec![o("comment", "say \"hi\"")]
    );
}

#[test]
fn several_options_per_line() {
    assert_eq!(
        opts("#SBATCH -N 2 --time=10 -J x\n"),
        vec![o("nodes", "2"), o("time", "10"), o("job-name", "x")]
    );
}

#[test]
fn short_long_and_spacing_forms() {
    let s = "#SBATCH -N4\n#SBATCH -N 5\n#SBATCH --nodes 6\n#SBATCH --nodes=7\n#SBATCH\t-t\t10\n#SBATCH--ntasks=3\n";
    assert_eq!(
        opts(s),
        vec![
            o("nodes", "4"),
            o("nodes", "5"),
            o("nodes", "6"),
            o("nodes", "7"),
            o("time", "10"),
            o("ntasks", "3")
        ]
    );
}

#[test]
fn clustered_short_flags() {
    let v = opts("#SBATCH -HN2\n");
    assert_eq!(v, vec![("hold".to_string(), None), o("nodes", "2")]);
}

#[test]
fn short_option_with_equals_is_accepted_with_warning() {
    let d = scan_script("#SBATCH -N=4\n").unwrap();
    assert_eq!(d.options[0].value.as_deref(), Some("4"));
    assert_eq!(d.warnings.len(), 1);
}

#[test]
fn unique_prefixes_resolve_like_getopt_long() {
    assert_eq!(
        opts("#SBATCH --ntasks-per-n=2\n"),
        vec![o("ntasks-per-node", "2")]
    );
    assert_eq!(opts("#SBATCH --job=x\n"), vec![o("job-name", "x")]);
    assert_eq!(opts("#SBATCH --part=gpu\n"), vec![o("partition", "gpu")]);
    assert_eq!(
        opts("#SBATCH --dep=afterok:1\n"),
        vec![o("dependency", "afterok:1")]
    );
    assert!(scan_script("#SBATCH --ti=5\n").is_err(), "time / time-min");
    assert!(
        scan_script("#SBATCH --nod=5\n").is_err(),
        "nodefile / nodelist / nodes"
    );
    // exact name wins over longer names sharing the prefix
    assert_eq!(opts("#SBATCH --time=5\n"), vec![o("time", "5")]);
    assert_eq!(opts("#SBATCH --mem=5G\n"), vec![o("mem", "5G")]);
    assert_eq!(opts("#SBATCH --gres=gpu:1\n"), vec![o("gres", "gpu:1")]);
}

#[test]
fn ambiguous_prefix_is_an_error_naming_the_line() {
    let e = scan_script("#!/bin/bash\n#SBATCH --n=2\n").unwrap_err();
    assert_eq!(e.line(), Some(2));
    let m = e.to_string();
    assert!(
        m.contains("ambiguous") && m.contains("--nodes") && m.contains("--ntasks"),
        "{m}"
    );
}

#[test]
fn unknown_option_is_a_warning() {
    let d = scan_script("#SBATCH --frobnicate=3\n#SBATCH -N 1\n").unwrap();
    assert_eq!(d.options.len(), 1);
    assert_eq!(d.warnings.len(), 1);
    assert_eq!(
        d.warnings[0].to_string(),
        "#SBATCH --frobnicate=3 ignored (unknown option)"
    );
}

#[test]
fn unmatched_quote_is_an_error() {
    let e = scan_script("#!/bin/sh\n#SBATCH -J \"oops\n").unwrap_err();
    assert!(matches!(e, SubmitError::Syntax { .. }));
    assert_eq!(e.line(), Some(2));
}

#[test]
fn missing_argument_is_an_error() {
    let e = scan_script("#SBATCH --time\n").unwrap_err();
    assert!(e.to_string().contains("requires an argument"));
}

#[test]
fn value_may_start_with_dash_like_getopt() {
    assert_eq!(opts("#SBATCH --job-name -x-\n"), vec![o("job-name", "-x-")]);
}

#[test]
fn no_line_continuation_like_sbatch() {
    // sbatch reads line by line: the trailing backslash is dropped and the
    // indented "--time" line is a command, which ends the header.
    let d = scan_script("#SBATCH -N 2 \\\n  --time=5\nhostname\n").unwrap();
    let v: Vec<_> = d
        .options
        .iter()
        .map(|o| (o.name.as_str(), o.value.as_deref()))
        .collect();
    assert_eq!(v, vec![("nodes", Some("2"))]);
    assert!(d.warnings.is_empty());
    assert_eq!(d.first_command_line, Some(2));
}

#[test]
fn crlf_is_handled_with_warning() {
    let d = scan_script("#!/bin/bash\r\n#SBATCH -N 2\r\necho\r\n").unwrap();
    assert_eq!(d.options[0].value.as_deref(), Some("2"));
    assert_eq!(d.warnings.len(), 1);
}

#[test]
fn hetjob_stops_with_warning() {
    let d = scan_script("#SBATCH -N 1\n#SBATCH hetjob\n#SBATCH -N 4\n").unwrap();
    assert_eq!(d.options.len(), 1);
    assert_eq!(d.warnings.len(), 1);
}

#[test]
fn pbs_directives_are_warned_once() {
    let d = scan_script("#PBS -l nodes=2\n#PBS -q x\n#SBATCH -N 1\n#BSUB -W 10\n").unwrap();
    assert_eq!(d.options.len(), 1);
    let w: Vec<String> = d.warnings.iter().map(|w| w.with_location()).collect();
    assert_eq!(
        w,
        [
            "line 1: #PBS directives on line(s) 1, 2 are not supported and were ignored; use #SBATCH or #LATTICE",
            "line 4: #BSUB directives on line(s) 4 are not supported and were ignored; use #SBATCH or #LATTICE",
        ]
    );
    assert_eq!(d.warnings[0].source, Source::Script { line: 1 });
}

#[test]
fn burst_buffer_directives_are_warned_line_by_line() {
    let d = scan_script(
        "#!/bin/bash\n#SBATCH -N 2\n#DW jobdw type=scratch capacity=1TiB access_mode=striped\n#DW stage_in source=/lus/in destination=$DW_JOB_STRIPED/in type=directory\n#BB create_persistent name=ckpt capacity=100GB\n#BB_LUA pool=fast\n#DWARF is a comment\nsrun ./app\n#DW stage_out source=a destination=b\n",
    )
    .unwrap();
    assert_eq!(d.options.len(), 1);
    let w: Vec<String> = d.warnings.iter().map(|w| w.with_location()).collect();
    let reason =
        "(burst buffers are not supported; use --data-mount to pre-stage data to the hot tier)";
    assert_eq!(
        w,
        [
            format!("line 3: #DW jobdw type=scratch capacity=1TiB access_mode=striped ignored {reason}"),
            format!("line 4: #DW stage_in source=/lus/in destination=$DW_JOB_STRIPED/in type=directory ignored {reason}"),
            format!("line 5: #BB create_persistent name=ckpt capacity=100GB ignored {reason}"),
            format!("line 6: #BB_LUA pool=fast ignored {reason}"),
            // After the first command, as for #SBATCH lines.
            "line 9: directives on line(s) 9 come after the first command (line 8) and were ignored, as sbatch does; move them above it".to_string(),
        ]
    );
    assert_eq!(d.warnings[0].source, Source::Script { line: 3 });
}

#[test]
fn lattice_directives_exact_names_only() {
    let d = scan_script(
        "#LATTICE --nodes=2\n#LATTICE --wall=1h\n#LATTICE tools_uenv=x\n#LATTICE sensitive\n",
    )
    .unwrap();
    let v: Vec<_> = d.options.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(v, vec!["nodes", "tools-uenv", "sensitive"]);
    assert_eq!(d.warnings.len(), 1);
    assert_eq!(d.options[0].dialect, Dialect::Lattice);
    assert_eq!(d.options[0].source, Source::Lattice { line: 1 });
}

#[test]
fn positional_words_are_warned() {
    let d = scan_script("#SBATCH hello -N 2\n").unwrap();
    assert_eq!(d.options.len(), 1);
    assert_eq!(d.warnings.len(), 1);
}

#[test]
fn tokenizer_basics() {
    let s = Source::CommandLine;
    assert_eq!(
        tokenize_directive("  a  'b c'\"d\" e\\ f # g", &s).unwrap(),
        vec!["a", "b cd", "e f"]
    );
    assert_eq!(tokenize_directive("\"\"", &s).unwrap(), vec![""]);
    assert!(tokenize_directive("'x", &s).is_err());
}

#[test]
fn parse_args_command_line() {
    let a: Vec<String> = ["-N", "2", "--parsable", "-t10"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (o, w) = parse_args(&a, Dialect::Slurm, &Source::CommandLine).unwrap();
    assert!(w.is_empty());
    let v: Vec<_> = o
        .iter()
        .map(|o| (o.name.as_str(), o.value.as_deref()))
        .collect();
    assert_eq!(
        v,
        vec![
            ("nodes", Some("2")),
            ("parsable", None),
            ("time", Some("10"))
        ]
    );
}
