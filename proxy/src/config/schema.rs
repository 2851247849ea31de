//! `meridian.toml`'s JSON Schema, derived from the config types (schemars): the one
//! description of every field's type, bounds, default and meaning. `meridian schema` prints
//! it (editors validate and complete `meridian.toml` with it); the chart's
//! `values.schema.json` (its `config` tree) and the book's configuration reference are
//! generated from it, and `proxy/tests/config_generated.rs` fails when either drifts.
//!
//! Bounds are written on the fields (`#[schemars(range(..))]`, `exclusiveMinimum`,
//! `length`, `regex`) beside the `check` that enforces them; the same test proves, field by
//! field, that `validate` refuses just past each bound and takes the bound itself. What
//! the schema cannot say in keywords the book still needs is carried in `x-` extensions,
//! which validators ignore:
//!
//! - `x-kind`: the book's word for the type where the JSON type is not enough (`address`,
//!   `URL`, `path`, `policy`, `filter`); numbers named `*_s` are seconds without it;
//! - `x-range`: the accepted values in words, for checks no keyword expresses (an existing
//!   family, a variable that is set, a relation between two fields);
//! - `x-default`: the default in words, where the code computes it;
//! - `x-key`: the name of a map's keys (`budget.per_family.<family>`).

use schemars::Schema;
use schemars::generate::SchemaSettings;
use schemars::transform::RecursiveTransform;
use serde_json::{Map, Value};

use super::MeridianConfig;

/// The schema of the whole file: JSON Schema draft 7, every section inline (no `$ref`), as
/// TOML can write it: an unset optional field is absent, never `null`.
pub fn json_schema() -> Value {
    let settings = SchemaSettings::draft07()
        .with(|s| s.inline_subschemas = true)
        .with_transform(RecursiveTransform(as_toml_writes_it as fn(&mut Schema)));
    let generator = settings.into_generator();
    let mut schema = generator.into_root_schema_for::<MeridianConfig>().to_value();
    // What the file is, first, as a reader of the schema expects it.
    let mut root = Map::new();
    if let Some(rest) = schema.as_object_mut() {
        for key in ["$schema", "title", "description"] {
            if let Some(v) = rest.remove(key) {
                root.insert(key.into(), v);
            }
        }
        root.insert("title".into(), "meridian.toml".into());
        root.append(rest);
    }
    Value::Object(root)
}

/// A doc comment's lines joined as the text it is (its line breaks are the source's
/// wrapping, not the writer's), paragraphs kept.
fn unwrapped(doc: &str) -> String {
    doc.split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// TOML has no null: an `Option` field's schema is its inner type's, with no `null` in its
/// `type` and no `"default": null` (absence is the default). Descriptions read as text.
fn as_toml_writes_it(schema: &mut Schema) {
    let Some(obj) = schema.as_object_mut() else { return };
    if let Some(Value::String(doc)) = obj.get_mut("description") {
        *doc = unwrapped(doc);
    }
    if let Some(Value::Array(types)) = obj.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            obj.insert("type".into(), only);
        }
    }
    if obj.get("default").is_some_and(Value::is_null) {
        obj.remove("default");
    }
    // An enum of strings with doc comments on its variants comes as `oneOf` of consts;
    // a plain `enum` gives the shorter error ("must be one of ...") in every validator.
    if let Some(Value::Array(variants)) = obj.get("oneOf") {
        let consts: Option<Vec<Value>> = variants.iter().map(|v| v.get("const").cloned()).collect();
        if let Some(consts) = consts {
            obj.remove("oneOf");
            obj.insert("type".into(), "string".into());
            obj.insert("enum".into(), Value::Array(consts));
        }
    }
    if let Some(Value::Array(values)) = obj.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
}
