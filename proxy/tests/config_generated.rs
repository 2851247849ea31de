//! What is generated from the config types, checked for drift, and the schema's bounds
//! checked against `validate`.
//!
//! Three files come from `meridian_proxy::config::json_schema()` (the types' doc comments
//! and `#[schemars]` attributes in proxy/src/config/ and core/src/config/): the schema itself as the book
//! publishes it (`docs/src/meridian.schema.json`), the chart's `values.schema.json` (its
//! `config` tree, less what the chart sets itself) and the book's configuration reference
//! (`docs/src/configuration.md`, between its markers). A test here fails when a file
//! differs from what the types give; after changing a config type, rewrite them with
//!
//! ```text
//! MERIDIAN_UPDATE_GENERATED=1 cargo test -p meridian-proxy --test config_generated
//! ```

use std::path::{Path, PathBuf};

use meridian_core::ModelRegistry;
use meridian_proxy::config::{json_schema, parse_config};
use serde_json::{Map, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Compares a generated file with the one in the tree, or writes it when asked to.
fn generated(path: &Path, want: &str) {
    if std::env::var_os("MERIDIAN_UPDATE_GENERATED").is_some() {
        std::fs::write(path, want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(path).unwrap();
    if have != want {
        let line = have.lines().zip(want.lines()).position(|(a, b)| a != b).map_or(0, |i| i + 1);
        panic!(
            "{} differs from what the config types give (first at line {line}); rewrite it with \
             `MERIDIAN_UPDATE_GENERATED=1 cargo test -p meridian-proxy --test config_generated`",
            path.display()
        );
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap() + "\n"
}

// ---------- the fields, as the book names them ----------

/// One field of `meridian.toml`: its dotted path as the book writes it
/// (`upstream.endpoints[].url`, `budget.per_family.<family>`) and its schema.
struct Leaf<'a> {
    path: String,
    schema: &'a Value,
    required: bool,
    /// A map's entries: `schema` is the entries' value schema, `map` the map's own.
    map: Option<&'a Value>,
}

fn leaves(schema: &Value) -> Vec<Leaf<'_>> {
    let mut out = Vec::new();
    walk(schema, "", &mut out);
    out
}

fn walk<'a>(node: &'a Value, prefix: &str, out: &mut Vec<Leaf<'a>>) {
    let required: Vec<&str> = node
        .get("required")
        .and_then(Value::as_array)
        .map_or(vec![], |r| r.iter().filter_map(Value::as_str).collect());
    for (name, field) in node["properties"].as_object().unwrap() {
        let path = format!("{prefix}{name}");
        let items = field.get("items");
        if field.get("properties").is_some() {
            walk(field, &format!("{path}."), out);
        } else if let Some(items) = items.filter(|i| i.get("properties").is_some()) {
            walk(items, &format!("{path}[]."), out);
        } else if let Some(entries) = field.get("additionalProperties").filter(|a| a.is_object()) {
            let key = field.get("x-key").and_then(Value::as_str).unwrap_or("key");
            out.push(Leaf {
                path: format!("{path}.<{key}>"),
                schema: entries,
                required: false,
                map: Some(field),
            });
        } else {
            out.push(Leaf { path, schema: field, required: required.contains(&name.as_str()), map: None });
        }
    }
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn number(v: &Value) -> String {
    v.to_string()
}

impl Leaf<'_> {
    /// Where the book's wording lives: the map itself for a map's entries.
    fn own(&self) -> &Value {
        self.map.unwrap_or(self.schema)
    }

    fn kind(&self) -> String {
        if let Some(kind) = text(self.own(), "x-kind") {
            return kind;
        }
        let s = self.schema;
        if let Some(values) = s.get("enum").and_then(Value::as_array) {
            return values
                .iter()
                .filter_map(Value::as_str)
                .map(|v| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join("/");
        }
        let name = self.path.rsplit('.').next().unwrap_or_default();
        match s["type"].as_str().unwrap() {
            "number" if name.ends_with("_s") || name.ends_with("_seconds") => "seconds".into(),
            "boolean" => "bool".into(),
            "array" => format!("list of {}s", s["items"]["type"].as_str().unwrap()),
            other => other.into(),
        }
    }

    fn default(&self) -> String {
        if let Some(words) = text(self.own(), "x-default") {
            return words;
        }
        if self.required {
            return "required".into();
        }
        match self.own().get("default") {
            None => "unset".into(),
            Some(Value::Object(m)) if m.is_empty() => "empty".into(),
            Some(Value::String(s)) => format!("`{s}`"),
            Some(v) => format!("`{v}`"),
        }
    }

    fn range(&self) -> String {
        if let Some(words) = text(self.own(), "x-range") {
            return words;
        }
        let s = self.schema;
        match (s.get("minimum"), s.get("exclusiveMinimum"), s.get("maximum")) {
            (Some(lo), None, Some(hi)) => format!("{}–{}", number(lo), number(hi)),
            (None, Some(lo), Some(hi)) => format!("({}, {}]", number(lo), number(hi)),
            (Some(lo), None, None) => format!("≥ {}", number(lo)),
            (None, Some(lo), None) => format!("> {}", number(lo)),
            (None, None, Some(hi)) => format!("≤ {}", number(hi)),
            _ if s.get("minLength").and_then(Value::as_u64) == Some(1) => "non-empty".into(),
            _ => String::new(),
        }
    }

    fn description(&self) -> String {
        let words =
            text(self.own(), "description").unwrap_or_else(|| panic!("{}: no doc comment", self.path));
        words.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

// ---------- the generated files ----------

const BEGIN: &str = "<!-- generated from the config types (their doc comments and #[schemars] attributes in \
                     proxy/src/config/ and core/src/config/) by proxy/tests/config_generated.rs: edit those, not \
                     this table -->";
const END: &str = "<!-- end of the generated reference -->";

fn reference_table(schema: &Value) -> String {
    let mut out = String::from(
        "| field | type | default | range | what it does, and how to tune it |\n|---|---|---|---|---|\n",
    );
    for leaf in leaves(schema) {
        let range = leaf.range();
        let range = if range.is_empty() { " ".into() } else { format!(" {range} ") };
        out += &format!(
            "| `{}` | {} | {} |{range}| {} |\n",
            leaf.path,
            leaf.kind(),
            leaf.default(),
            leaf.description().replace('|', "\\|")
        );
    }
    out
}

/// Fields the chart writes itself, from its own values: a user setting them in `config`
/// would fight the chart, so its schema leaves them out and says where they come from.
const SET_BY_THE_CHART: [(&str, &str, &str); 4] = [
    ("server", "listen", "listen is set by the chart from proxy.port"),
    ("upstream", "endpoints", "endpoints are set by the chart (vllm.models, externalUpstreams)"),
    ("twin", "enabled", "enabled is set by the chart from demo"),
    ("hook", "listen", "listen is set by the chart from vllm.hook.port"),
];

/// Drops what a values file needs no help with: the book's `x-` words, integer formats
/// and the defaults (the chart writes only what a user sets; `meridian.toml`'s defaults
/// apply to the rest).
fn for_values(node: &mut Value) {
    if let Value::Object(obj) = node {
        obj.retain(|k, _| !k.starts_with("x-") && k != "format" && k != "default");
        if let Some(Value::Object(props)) = obj.get_mut("properties") {
            props.values_mut().for_each(for_values);
        }
        for key in ["items", "additionalProperties"] {
            if let Some(sub) = obj.get_mut(key) {
                for_values(sub);
            }
        }
    }
}

fn chart_config(schema: &Value) -> Value {
    let mut config = schema.clone();
    for_values(&mut config);
    let obj = config.as_object_mut().unwrap();
    obj.remove("$schema");
    obj.remove("title");
    obj.insert(
        "description".into(),
        "meridian.toml as a tree (docs/src/configuration.md), generated from the proxy's config types \
         (`meridian schema`); the proxy's own checks run on every file the chart renders"
            .into(),
    );
    let sections = obj["properties"].as_object_mut().unwrap();
    for (section, field, note) in SET_BY_THE_CHART {
        let s = sections[section].as_object_mut().unwrap();
        s["properties"].as_object_mut().unwrap().remove(field).unwrap();
        let said = s.get("description").and_then(Value::as_str).unwrap_or_default().to_owned();
        s.insert("description".into(), format!("{said} In the chart: {note}.").trim_start().into());
    }
    config
}

#[test]
fn the_published_schema_is_the_types() {
    generated(&repo().join("docs/src/meridian.schema.json"), &pretty(&json_schema()));
}

#[test]
fn the_charts_config_schema_is_the_types() {
    let path = repo().join("helm/meridian/values.schema.json");
    let mut values: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    values["properties"]["config"] = chart_config(&json_schema());
    generated(&path, &pretty(&values));
}

#[test]
fn the_books_configuration_reference_is_the_types() {
    let path = repo().join("docs/src/configuration.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let (head, rest) =
        page.split_once(BEGIN).expect("configuration.md has the generated table's start marker");
    let (_, tail) = rest.split_once(END).expect("configuration.md has the generated table's end marker");
    let want = format!("{head}{BEGIN}\n{}{END}{tail}", reference_table(&json_schema()));
    generated(&path, &want);
}

#[test]
fn every_field_has_a_doc_comment_a_type_and_a_default() {
    let schema = json_schema();
    let all = leaves(&schema);
    assert!(all.len() > 60, "the walker found only {} fields", all.len());
    for leaf in all {
        assert!(!leaf.description().is_empty(), "{}", leaf.path);
        assert!(!leaf.kind().is_empty() && !leaf.default().is_empty(), "{}", leaf.path);
    }
}

// ---------- the bounds the schema states are the ones validate enforces ----------

/// Whether `validate` (or the parse before it) refuses `path = value`, naming that path.
fn refused(path: &str, value: &str) -> bool {
    let (table, field) = path.rsplit_once('.').unwrap();
    let toml = format!("[{table}]\n{field} = {value}\n");
    match parse_config(&toml, "bounds.toml", &[]) {
        Err(e) => e.to_string().contains(field),
        Ok(cfg) => cfg
            .validate(&ModelRegistry::builtin().unwrap())
            .err()
            .is_some_and(|errs| errs.iter().any(|e| e.path == path)),
    }
}

/// Values at and just past each bound of a field: `(value, accepted)`.
fn probes(s: &Map<String, Value>) -> Vec<(String, bool)> {
    let int = s.get("type").and_then(Value::as_str) == Some("integer");
    let lit = |x: f64| if int { format!("{}", x as i64) } else { format!("{x:?}") };
    let step = if int { 1.0 } else { 0.5 };
    let mut out = Vec::new();
    if let Some(lo) = s.get("minimum").and_then(Value::as_f64) {
        out.push((lit(lo), true));
        out.push((lit(lo - step), false));
    }
    if let Some(lo) = s.get("exclusiveMinimum").and_then(Value::as_f64) {
        out.push((lit(lo), false));
        out.push((lit(lo + step), true));
    }
    if let Some(hi) = s.get("maximum").and_then(Value::as_f64) {
        out.push((lit(hi), true));
        out.push((lit(hi + step), false));
    }
    if s.get("minLength").and_then(Value::as_u64) == Some(1) {
        out.push(("\"\"".into(), false));
    }
    if let Some(values) = s.get("enum").and_then(Value::as_array) {
        out.extend(values.iter().map(|v| (v.to_string(), true)));
        out.push(("\"none-of-these\"".into(), false));
    }
    out
}

#[test]
fn every_bound_in_the_schema_is_the_one_validate_enforces() {
    let schema = json_schema();
    let mut probed = 0;
    // Fields of a list's entries or a map's are checked with their table in tests/config.rs.
    for leaf in leaves(&schema).into_iter().filter(|l| !l.path.contains("[]") && l.map.is_none()) {
        for (value, accepted) in probes(leaf.schema.as_object().unwrap()) {
            assert_eq!(
                refused(&leaf.path, &value),
                !accepted,
                "{} = {value}: the schema says {}, validate {}",
                leaf.path,
                if accepted { "yes" } else { "no" },
                if accepted { "refuses it" } else { "takes it" },
            );
            probed += 1;
        }
    }
    assert!(probed > 60, "only {probed} bounds probed");
}
