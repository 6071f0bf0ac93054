//! The chat panel's structured-output option: a collapsible JSON-schema box per conversation,
//! checked as it is typed (a parse error is shown under it), and the grammar a send uses.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tpslab_engine::serving::constraint::Grammar;

/// A conversation's structured-output option: answers are JSON valid against `json_schema` when
/// on. (Saved flattened into the conversation, under these field names.)
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SchemaOption {
    pub json_schema_on: bool,
    pub json_schema: String,
}

impl SchemaOption {
    /// The schema box of conversation `id`. Never fails: an invalid schema is shown as an error
    /// and the send refuses it.
    pub fn ui(&mut self, ui: &mut egui::Ui, id: u64) {
        egui::CollapsingHeader::new("JSON schema")
            .id_salt(("chat_schema", id))
            .show(ui, |ui| {
                ui.checkbox(
                    &mut self.json_schema_on,
                    "Answer with JSON valid against this schema",
                );
                let l = ui.label("Schema");
                ui.add(
                    egui::TextEdit::multiline(&mut self.json_schema)
                        .code_editor()
                        .desired_rows(4)
                        .hint_text(
                            r#"{"type": "object", "properties": {"answer": {"type": "string"}}}"#,
                        ),
                )
                .labelled_by(l.id);
                if self.json_schema_on
                    && let Err(e) = self.grammar()
                {
                    ui.colored_label(ui.visuals().error_fg_color, format!("Error: {e}"));
                }
            });
    }

    /// The grammar of a send: `None` with the option off; an error for a schema that is not
    /// JSON (one llguidance refuses is reported when the send compiles it).
    pub fn grammar(&self) -> Result<Option<Grammar>, String> {
        if !self.json_schema_on {
            return Ok(None);
        }
        let schema: Value = serde_json::from_str(&self.json_schema)
            .map_err(|e| format!("the JSON schema is not valid JSON: {e}"))?;
        if !schema.is_object() {
            return Err("the JSON schema must be an object".into());
        }
        Ok(Some(Grammar::json_schema(schema)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_invalid_and_valid_schemas() {
        let mut conv = SchemaOption {
            json_schema: "{not json".into(),
            ..SchemaOption::default()
        };
        assert_eq!(conv.grammar(), Ok(None), "off: the box is ignored");
        conv.json_schema_on = true;
        assert!(conv.grammar().is_err_and(|e| e.contains("not valid JSON")));
        conv.json_schema = "[1]".into();
        assert!(conv.grammar().is_err());
        conv.json_schema = r#"{"type": "object"}"#.into();
        assert_eq!(
            conv.grammar(),
            Ok(Some(Grammar::json_schema(
                serde_json::json!({"type": "object"})
            )))
        );
    }
}
