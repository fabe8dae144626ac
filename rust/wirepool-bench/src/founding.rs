//! The founding workload's two row shapes (`bench/shapes/founding.json`) as typed structs, and
//! their generator, which interprets the shape's field list from that file: the Rust side of the
//! rows every runner of `bench/` produces (`bench/tests/test_founding.py` checks the digests).
//!
//! Binaries of this crate: `founding-worker` (a wirepool worker streaming the rows one at a
//! time), `founding-parent` (the wirepool runner with a Rust parent: Rust, Python or Node
//! worker), `founding-codec` (the codec alone on the same rows). `founding-ipc` (the ipc-channel
//! incumbent, one row per message or batched by hand) lives in `ipc-channel-incumbent/`, kept
//! out of the workspace, and `bench/json-alt` compares JSON libraries on these rows: both
//! compile this file in with `#[path]`, so it depends on serde, serde_json and itoa only.

use std::fmt::Write as _;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The shape file, compiled in (the same file every other runner reads).
pub const SPEC: &str = include_str!("../../../bench/shapes/founding.json");

/// A declaration-like row of `small_rows_8192` (97 bytes of JSON at its reference row).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct SmallRow {
    pub id: u64,
    pub name: String,
    pub kind: String,
    pub module: String,
    pub line: u64,
}

/// A 4 KiB payload row of `large_rows_512` (4,154 bytes of JSON at its reference row).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct LargeRow {
    pub id: u64,
    pub name: String,
    pub kind: String,
    pub payload: String,
}

/// The `{"shape", "n"}` request of the workers' `rows` method.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct RowsReq {
    pub shape: String,
    pub n: u64,
}

/// One field's rule, read from the shape file.
#[derive(Debug, Clone)]
enum Field {
    Index,
    Int { add: u64, modulo: u64 },
    Str { prefix: String, index_suffix: bool },
    Payload { tail: String },
}

/// A shape's generator: the field rules in the struct's field order.
#[derive(Debug, Clone)]
pub struct Gen {
    fields: Vec<Field>,
}

impl Gen {
    /// The generator of `shape` for a struct whose fields are `names` (in order); an error when
    /// the file's fields differ from the struct's.
    pub fn new(shape: &str, names: &[&str]) -> Result<Gen, String> {
        let spec: serde_json::Value = serde_json::from_str(SPEC).map_err(|e| e.to_string())?;
        let fields = spec["shapes"][shape]["fields"]
            .as_array()
            .ok_or_else(|| format!("no shape {shape:?} in founding.json"))?;
        let got: Vec<&str> = fields.iter().filter_map(|f| f["name"].as_str()).collect();
        if got != names {
            return Err(format!(
                "shape {shape}: fields {got:?}, the struct has {names:?}"
            ));
        }
        let fields = fields
            .iter()
            .map(|f| match f["kind"].as_str() {
                Some("index") => Ok(Field::Index),
                Some("int") => Ok(Field::Int {
                    add: f["add"].as_u64().unwrap_or(0),
                    modulo: f["mod"].as_u64().unwrap_or(u64::MAX).max(1),
                }),
                Some("str") => Ok(Field::Str {
                    prefix: f["prefix"].as_str().unwrap_or("").to_string(),
                    index_suffix: f["index_suffix"].as_bool().unwrap_or(false),
                }),
                Some("payload") => {
                    let len = f["len"].as_u64().unwrap_or(8) as usize;
                    let fill = f["fill"].as_str().unwrap_or("x");
                    let tail: String = fill.chars().cycle().take(len.saturating_sub(8)).collect();
                    Ok(Field::Payload { tail })
                }
                other => Err(format!("unknown field kind {other:?}")),
            })
            .collect::<Result<_, _>>()?;
        Ok(Gen { fields })
    }

    fn int(&self, k: usize, i: u64) -> u64 {
        match &self.fields[k] {
            Field::Index => i,
            Field::Int { add, modulo } => add + i % modulo,
            _ => panic!("field {k} is not an integer"),
        }
    }

    /// Writes field `k` of row `i` into `out`, reusing its allocation. A payload of the full
    /// length (its tail written by an earlier call: rows are only filled here) only gets its 8
    /// digits rewritten, so refilling a large row costs no 4 KiB copy or compare.
    fn text(&self, k: usize, i: u64, out: &mut String) {
        match &self.fields[k] {
            Field::Str {
                prefix,
                index_suffix,
            } => {
                if !*index_suffix {
                    if out != prefix {
                        out.clear();
                        out.push_str(prefix);
                    }
                    return;
                }
                out.clear();
                out.push_str(prefix);
                out.push_str(itoa::Buffer::new().format(i));
            }
            Field::Payload { tail } => {
                let mut digits = String::with_capacity(20);
                let _ = write!(digits, "{:08}", i % 100_000_000);
                if out.len() == 8 + tail.len() {
                    out.replace_range(..8, &digits);
                } else {
                    out.clear();
                    out.push_str(&digits);
                    out.push_str(tail);
                }
            }
            _ => panic!("field {k} is not a string"),
        }
    }
}

/// A row of one of the shapes: made and refilled in place by its generator.
pub trait FoundingRow: Serialize + DeserializeOwned + Send + Default + 'static {
    /// The shape's name in founding.json.
    const SHAPE: &'static str;
    /// The struct's field names, in order.
    const FIELDS: &'static [&'static str];
    /// Rewrites `self` into row `i`.
    fn fill(&mut self, gen: &Gen, i: u64);
    /// The row's index field.
    fn index(&self) -> u64;
    /// The generator of this shape.
    fn gen() -> Gen {
        Gen::new(Self::SHAPE, Self::FIELDS).expect("founding.json matches the struct")
    }
    /// Row `i`, new.
    fn make(gen: &Gen, i: u64) -> Self {
        let mut row = Self::default();
        row.fill(gen, i);
        row
    }
}

impl FoundingRow for SmallRow {
    const SHAPE: &'static str = "small_rows_8192";
    const FIELDS: &'static [&'static str] = &["id", "name", "kind", "module", "line"];
    fn fill(&mut self, gen: &Gen, i: u64) {
        self.id = gen.int(0, i);
        gen.text(1, i, &mut self.name);
        gen.text(2, i, &mut self.kind);
        gen.text(3, i, &mut self.module);
        self.line = gen.int(4, i);
    }
    fn index(&self) -> u64 {
        self.id
    }
}

impl FoundingRow for LargeRow {
    const SHAPE: &'static str = "large_rows_512";
    const FIELDS: &'static [&'static str] = &["id", "name", "kind", "payload"];
    fn fill(&mut self, gen: &Gen, i: u64) {
        self.id = gen.int(0, i);
        gen.text(1, i, &mut self.name);
        gen.text(2, i, &mut self.kind);
        gen.text(3, i, &mut self.payload);
    }
    fn index(&self) -> u64 {
        self.id
    }
}

/// The sha256-free digest input: rows `0..n` of `R` as compact JSON, one per line (the tests
/// hash this output and compare it with the other languages').
pub fn json_lines<R: FoundingRow>(n: u64, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let gen = R::gen();
    let mut row = R::default();
    for i in 0..n {
        row.fill(&gen, i);
        serde_json::to_writer(&mut *out, &row)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}
