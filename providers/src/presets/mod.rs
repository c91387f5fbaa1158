//! Ready presets: `preset = "NAME"` in a provider table stands for the `kind = "rest"`
//! description of a widely used API, so that a user writes only what is theirs.
//!
//! ```toml
//! [providers.shop]
//! preset = "shopify_orders"
//! base_url = "https://example.myshopify.com"   # the preset cannot know the shop
//! schedule = "0 */15 * * * *"
//! connections = [{ user_id = "ops", token_env = "SHOPIFY_TOKEN" }]
//! ```
//!
//! [`apply`] replaces `preset = "NAME"` by the preset's table merged with the user's: every
//! key the user gives wins over the preset's; tables (`pagination`, `query`, `headers`,
//! `incremental`) merge key by key, recursively; arrays and other values are replaced
//! whole. The root crate calls it on the adapter part of `[providers.NAME]` before that
//! part is deserialized, so the merged table is read and validated exactly as if the user
//! had written it all.
//!
//! Each preset is a file `providers/presets/NAME.toml`, embedded at build time, that holds
//! `kind = "rest"`, the adapter keys its API's documentation calls for, and a `[requires]`
//! table naming the keys the user must give (dotted, e.g. `"headers.Harvest-Account-Id"`)
//! and what each one is; `apply` refuses a table that leaves one out. A preset whose API
//! offers OAuth2 has an `[oauth2]` table with the vendor's documented endpoints: a
//! provider table that writes `auth = { oauth2 = "refresh_token", client_id = ...,
//! client_secret_env = ... }` gets them under its own keys, so the Connect page can
//! authorize its users. `auth = { shopify_app = ... }` (Shopify's per-shop flow) replaces
//! the preset's `auth` and waives its `base_url`: each shop connected brings its own.
//! A preset never holds
//! a secret: tokens stay on the connections. `providers/presets/README.md` lists the
//! presets and the documentation facts each follows.
//!
//! - [`apply`]: expands `preset = "NAME"`.
//! - [`names`]: the presets there are.

use toml::{Table, Value};

/// Declares the registry: the preset names and their embedded files, in the same order.
macro_rules! presets {
    ($($name:literal,)+) => {
        /// The name of every preset, in the order of [`FILES`].
        const NAMES: &[&str] = &[$($name),+];
        /// The text of every preset file, in the order of [`NAMES`].
        const FILES: &[&str] = &[$(include_str!(concat!("../../presets/", $name, ".toml"))),+];
    };
}

presets! {
    "asana_tasks",
    "freshdesk_tickets",
    "gitlab_issues",
    "harvest_time_entries",
    "pipedrive_deals",
    "shopify_orders",
}

/// The key of a provider table that names a preset.
const PRESET_KEY: &str = "preset";
/// The table of a preset file that names the keys the user must give.
const REQUIRES_KEY: &str = "requires";
/// The table of a preset file that holds its API's documented OAuth2 application
/// endpoints (`authorize_url`, `token_url`, `pkce`, `client_auth`, `scope`): the base of
/// `auth` when the provider table chooses OAuth2 (`auth = { oauth2 = ... }`).
const OAUTH2_KEY: &str = "oauth2";

/// The name of every preset, for messages and docs.
pub fn names() -> &'static [&'static str] {
    NAMES
}

/// Expands `preset = "NAME"` in a provider's table: the key is removed and the table
/// becomes the preset merged with the user's keys, the user's winning (tables merge key by
/// key, other values are replaced). A table without `preset` is left as it is. On error
/// the table is left as it is and the message names what was wrong: a `preset` that is not
/// a string, an unknown name (listing the presets), a `kind` other than the preset's, or a
/// key the preset requires that the table does not give.
pub fn apply(table: &mut Table) -> Result<(), String> {
    let name = match table.get(PRESET_KEY) {
        None => return Ok(()),
        Some(Value::String(name)) => name.clone(),
        Some(other) => {
            return Err(format!(
                "preset must be a string naming a preset ({}), not {}",
                names().join(", "),
                other.type_str()
            ))
        }
    };
    let mut preset = load(&name)?;
    let requires = take_requires(&name, &mut preset)?;
    if let (Some(own), Some(theirs)) = (preset.get("kind"), table.get("kind")) {
        if own != theirs {
            return Err(format!(
                "preset {name:?} is kind = {own}, but the table sets kind = {theirs}; leave \
                 kind out when using a preset"
            ));
        }
    }
    let mut user = table.clone();
    user.remove(PRESET_KEY);
    let oauth2 = preset.remove(OAUTH2_KEY);
    if chooses_oauth2(&user) {
        // The preset's own `auth` (a key in a header) would merge into the user's
        // OAuth2 table key by key: the API's OAuth2 endpoints stand in for it instead.
        match oauth2 {
            Some(endpoints) => preset.insert("auth".to_string(), endpoints),
            None => preset.remove("auth"),
        };
    }
    let shopify_app = chooses_shopify_app(&user);
    if shopify_app {
        // The app sends its token in X-Shopify-Access-Token as the preset's `auth` does;
        // its table replaces the preset's rather than merging into it.
        preset.remove("auth");
    }
    merge(&mut preset, user);
    for (key, what) in &requires {
        // Each connection of a Shopify app brings its shop's origin.
        if shopify_app && key == "base_url" {
            continue;
        }
        match lookup(&preset, key) {
            None => return Err(format!("preset {name:?} needs {key}: {what}")),
            // An empty value would be sent as is (`Harvest-Account-Id:`, `?project=`) and
            // fail only at the API, with its own message.
            Some((given, Value::String(value))) if value.trim().is_empty() => {
                return Err(format!(
                    "{given} is empty; preset {name:?} needs {key}: {what}"
                ))
            }
            Some(_) => {}
        }
    }
    *table = preset;
    Ok(())
}

/// Whether a provider table authenticates with OAuth2: `auth = { oauth2 = ... }`.
fn chooses_oauth2(table: &Table) -> bool {
    table
        .get("auth")
        .and_then(Value::as_table)
        .is_some_and(|auth| auth.contains_key(OAUTH2_KEY))
}

/// Whether a provider table authorizes shops as a Shopify app:
/// `auth = { shopify_app = { ... } }`.
fn chooses_shopify_app(table: &Table) -> bool {
    table
        .get("auth")
        .and_then(Value::as_table)
        .is_some_and(|auth| auth.contains_key("shopify_app"))
}

/// The preset called `name`, parsed.
fn load(name: &str) -> Result<Table, String> {
    let Some(index) = NAMES.iter().position(|known| *known == name) else {
        return Err(format!(
            "unknown preset {name:?}; the presets are: {}",
            names().join(", ")
        ));
    };
    let text = FILES.get(index).copied().unwrap_or_default();
    text.parse::<Table>()
        .map_err(|err| format!("preset {name:?} is not valid TOML: {err}"))
}

/// Removes the preset's `[requires]` table: (dotted key, what the user must give).
fn take_requires(name: &str, preset: &mut Table) -> Result<Vec<(String, String)>, String> {
    let Some(requires) = preset.remove(REQUIRES_KEY) else {
        return Ok(Vec::new());
    };
    let Value::Table(requires) = requires else {
        return Err(format!(
            "preset {name:?} has a [requires] that is not a table"
        ));
    };
    requires
        .into_iter()
        .map(|(key, what)| match what {
            Value::String(what) => Ok((key, what)),
            other => Err(format!(
                "preset {name:?} has requires.{key} = {}, expected a string saying what to \
                 give",
                other.type_str()
            )),
        })
        .collect()
}

/// The tables whose keys are HTTP header names, which are case-insensitive (RFC 9110).
const HEADERS_KEY: &str = "headers";

/// Merges `user` into `base`: each of its keys replaces the base's, except that a table
/// given for a table merges into it key by key. In a `headers` table a user's header
/// replaces the base's of the same name in any case, so that one header is sent once.
fn merge(base: &mut Table, user: Table) {
    merge_table(base, user, false);
}

fn merge_table(base: &mut Table, user: Table, header_names: bool) {
    for (key, value) in user {
        let existing = if header_names {
            base.keys()
                .find(|own| own.eq_ignore_ascii_case(&key))
                .cloned()
        } else {
            Some(key.clone())
        };
        match (existing.as_ref().and_then(|own| base.get_mut(own)), value) {
            (Some(Value::Table(own)), Value::Table(theirs)) => {
                merge_table(own, theirs, key == HEADERS_KEY)
            }
            (_, value) => {
                if let Some(own) = existing.filter(|own| *own != key) {
                    base.remove(&own);
                }
                base.insert(key, value);
            }
        }
    }
}

/// The value at a dotted `key` (`"headers.Harvest-Account-Id"`), if the table has one,
/// with the dotted key as the table spells it: a header name matches in any case.
fn lookup<'a>(table: &'a Table, key: &str) -> Option<(String, &'a Value)> {
    let mut segments = key.split('.');
    let first = segments.next()?;
    let mut value = table.get(first)?;
    let mut given = first.to_string();
    let mut header_names = first == HEADERS_KEY;
    for segment in segments {
        let table = value.as_table()?;
        let (name, next) = if header_names {
            table
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(segment))?
        } else {
            table.get_key_value(segment)?
        };
        header_names = name == HEADERS_KEY;
        given = format!("{given}.{name}");
        value = next;
    }
    Some((given, value))
}

#[cfg(test)]
mod tests;
