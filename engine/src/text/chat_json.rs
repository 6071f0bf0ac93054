//! The `tojson` filter of chat templates, as transformers defines it: Python's `json.dumps` with
//! its arguments (`ensure_ascii`, `indent`, `separators`, `sort_keys`), which writes `", "` and
//! `": "` separators and no HTML escaping, unlike minijinja's own `tojson`.

use minijinja::value::{ArgType, Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The filter's parameters in transformers' order: `tojson(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`. A positional argument fills them in this order, as in
/// Python (so `tojson(4)` sets `ensure_ascii`, not `indent`).
const PARAMS: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
pub fn tojson(value: &Value, Rest(mut args): Rest<Value>) -> Result<Value, Error> {
    // Keyword arguments arrive as the last value (minijinja's variadic arguments take them too).
    let kwargs = match args.last().map(|v| Kwargs::from_value(Some(v))) {
        Some(Ok(k)) => {
            args.pop();
            k
        }
        _ => Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
    };
    if args.len() > PARAMS.len() {
        return Err(bad(format!(
            "tojson takes at most {} arguments, {} given",
            PARAMS.len(),
            args.len()
        )));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (i, name) in PARAMS.iter().enumerate() {
        let by_name = kwargs.get::<Option<Value>>(name)?;
        given[i] = match (args.get(i), by_name) {
            (Some(_), Some(_)) => {
                return Err(bad(format!("tojson got multiple values for '{name}'")));
            }
            (Some(v), None) => Some(v.clone()),
            (None, v) => v,
        };
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = given;
    let truthy = |v: Option<Value>| v.is_some_and(|v| v.is_true());
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        // Python repeats a string indent as is, and an int as that many spaces (none below 1).
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(
                usize::try_from(i64::try_from(v)?.max(0))
                    .unwrap_or(0)
                    .min(64),
            ),
        }),
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<String> = s
                .try_iter()?
                .map(|p| p.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("tojson: separators must be two strings".into()))?;
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => (item, key),
                Err(_) => return Err(bad("tojson: separators must be a pair".into())),
            }
        }
        // Python's defaults: ", " without indent, "," with it (the newline separates items).
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let opts = JsonOpts {
        indent,
        ensure_ascii: truthy(ensure_ascii),
        sort_keys: truthy(sort_keys),
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from(out))
}

fn bad(msg: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg)
}

struct JsonOpts {
    /// What one level of indentation is (None: all on one line).
    indent: Option<String>,
    ensure_ascii: bool,
    sort_keys: bool,
    item_sep: String,
    key_sep: String,
}

fn newline_indent(out: &mut String, opts: &JsonOpts, depth: usize) {
    if let Some(unit) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(unit);
        }
    }
}

fn write_json(out: &mut String, v: &Value, opts: &JsonOpts, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                out.push_str(&python_float(f64::try_from(v.clone())?));
            }
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, opts, depth, ('[', ']'), &items, |out, item, depth| {
                write_json(out, item, opts, depth)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            let entries: Vec<(Value, Value)> = keys
                .into_iter()
                .map(|k| v.get_item(&k).map(|val| (k, val)))
                .collect::<Result<_, _>>()?;
            write_container(
                out,
                opts,
                depth,
                ('{', '}'),
                &entries,
                |out, (k, val), depth| {
                    match k.as_str() {
                        Some(s) => write_json_str(out, s, opts.ensure_ascii),
                        None => write_json_str(out, &k.to_string(), opts.ensure_ascii),
                    }
                    out.push_str(&opts.key_sep);
                    write_json(out, val, opts, depth)
                },
            )?;
        }
        ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of kind {}", v.kind()),
            ));
        }
        // ValueKind is non-exhaustive; anything new is refused rather than guessed.
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: unsupported value",
            ));
        }
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    opts: &JsonOpts,
    depth: usize,
    (open, close): (char, char),
    items: &[T],
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        newline_indent(out, opts, depth + 1);
        write_item(out, item, depth + 1)?;
    }
    newline_indent(out, opts, depth);
    out.push(close);
    Ok(())
}

/// A string as Python's json module writes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` writes it (`1.0`, `0.1`, `1e+20`, `1e-07`, `NaN`, `Infinity`).
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let s = format!("{x:?}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            let mantissa = mantissa.strip_suffix(".0").unwrap_or(mantissa);
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}
