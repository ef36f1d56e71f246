//! `lattice api-resources`: the kinds the server serves (from discovery).

use std::io::Write;

use crate::cli::ApiResourcesArgs;
use crate::errors::CliError;
use crate::kinds::GROUP_VERSION;
use crate::output::Table;
use crate::Ctx;

/// Runs `api-resources`.
pub async fn run(
    ctx: &mut Ctx,
    args: &ApiResourcesArgs,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let mut kinds = ctx
        .catalog
        .discover(&ctx.client, GROUP_VERSION)
        .await
        .map_err(|e| CliError::from_client("list API resources", e))?;
    kinds.sort_by(|a, b| a.plural.cmp(&b.plural));
    let mut t = Table::new(
        ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    );
    for k in &kinds {
        t.rows.push(vec![
            k.plural.clone(),
            k.short_names.join(","),
            k.group_version.clone(),
            k.namespaced.to_string(),
            k.kind.clone(),
        ]);
    }
    out.write_all(t.render(args.no_headers).as_bytes())?;
    Ok(0)
}
