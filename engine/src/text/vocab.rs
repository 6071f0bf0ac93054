//! A model's vocabulary as llama.cpp holds it after loading (`llama_vocab::impl::load`): token
//! texts, scores and attributes, the special ids with llama.cpp's defaults and text-based
//! detection, the end-of-generation set, and each token's decoded piece.
//!
//! Why replicate llama.cpp's quirks here (forcing `<|im_end|>` to control, Phi-3's right-strip
//! of special tokens, ...): they decide which ids a text gets and which tokens stop generation,
//! and llama.cpp is the reference every test holds this engine against.

use std::collections::HashMap;

/// llama.cpp's `llama_token_attr` bits.
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// The attribute a GGUF token type (`tokenizer.ggml.token_type`) stands for.
pub(crate) fn attr_of_type(ty: u64) -> u16 {
    match ty {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        // 0 (undefined) and anything unknown: no attribute, decoded as nothing.
        _ => 0,
    }
}

/// Which tokenizer runs over the vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VocabKind {
    /// GPT-2 style byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
    Bpe,
    /// SentencePiece (`tokenizer.ggml.model = "llama"`).
    Spm,
}

/// Special ids as the file gives them (each already checked to lie inside the vocabulary).
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Picks one id of [`SpecialIds`].
type SlotOf = fn(&mut SpecialIds) -> &mut Option<u32>;

/// End-of-turn texts llama.cpp takes as EOT when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Every token with one of these texts ends generation (llama.cpp's `special_eog_ids` list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// gpt-oss's channel markers, which llama.cpp always renders (user-defined, whatever the file says).
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The loaded vocabulary. Read-only after [`Vocab::new`].
#[derive(Debug)]
pub(crate) struct Vocab {
    pub kind: VocabKind,
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u16>,
    /// Text -> id; for a text that appears twice, its first id.
    pub ids: HashMap<String, u32>,
    pub special: SpecialIds,
    /// Tokens that end generation, sorted.
    pub eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first (ties by id): the order in
    /// which they are cut out of text before tokenizing.
    pub special_order: Vec<u32>,
}

impl Vocab {
    /// Builds the vocabulary: `texts` and `types` of equal length (checked by the caller),
    /// `scores` the same length or empty, `general_name` for llama.cpp's per-model attributes.
    pub fn new(
        kind: VocabKind,
        mut texts: Vec<String>,
        mut scores: Vec<f32>,
        types: &[u64],
        special: SpecialIds,
        general_name: Option<&str>,
    ) -> Self {
        for (i, t) in texts.iter_mut().enumerate() {
            if t.is_empty() {
                // As llama.cpp: an empty token would match everywhere and nowhere.
                *t = format!("[EMPTY_{i}]");
            }
        }
        scores.resize(texts.len(), 0.0);
        let mut ids = HashMap::with_capacity(texts.len());
        for (id, t) in (0u32..).zip(&texts) {
            ids.entry(t.clone()).or_insert(id);
        }
        let attrs = types.iter().map(|&t| attr_of_type(t)).collect();
        let mut v = Self {
            kind,
            texts,
            scores,
            attrs,
            ids,
            special,
            eog: Vec::new(),
            special_order: Vec::new(),
        };
        v.detect_specials();
        v.collect_eog();
        for text in ALWAYS_RENDERED {
            if let Some(&id) = v.ids.get(*text) {
                v.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        v.special_order = (0u32..)
            .zip(&v.attrs)
            .filter(|(_, a)| **a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .map(|(id, _)| id)
            .collect();
        // Stable: equal lengths keep id order.
        v.special_order
            .sort_by_key(|&id| std::cmp::Reverse(v.texts[id as usize].len()));
        v.set_model_attrs(general_name);
        v
    }

    /// The lowest id among tokens with one of `texts`.
    fn first_of(&self, texts: &[&str]) -> Option<u32> {
        texts.iter().filter_map(|t| self.ids.get(*t).copied()).min()
    }

    fn force_control(&mut self, id: u32) {
        self.attrs[id as usize] |= attr::CONTROL;
    }

    /// EOT, EOM and FIM ids the file does not name, found by text (llama.cpp's workaround for
    /// converters that leave them out); each found token becomes a control token.
    fn detect_specials(&mut self) {
        let table: [(SlotOf, &[&str]); 8] = [
            (|s| &mut s.eot, EOT_TEXTS),
            (|s| &mut s.eom, EOM_TEXTS),
            (|s| &mut s.fim_pre, FIM_PRE_TEXTS),
            (|s| &mut s.fim_suf, FIM_SUF_TEXTS),
            (|s| &mut s.fim_mid, FIM_MID_TEXTS),
            (|s| &mut s.fim_pad, FIM_PAD_TEXTS),
            (|s| &mut s.fim_rep, FIM_REP_TEXTS),
            (|s| &mut s.fim_sep, FIM_SEP_TEXTS),
        ];
        for (slot, texts) in table {
            if slot(&mut self.special).is_some() {
                continue;
            }
            if let Some(id) = self.first_of(texts) {
                *slot(&mut self.special) = Some(id);
                self.force_control(id);
            }
        }
    }

    /// llama.cpp's end-of-generation set: FIM pad/repo/separator, every token with an
    /// end-of-turn text (made control), EOS, EOT and EOM.
    fn collect_eog(&mut self) {
        let s = &self.special;
        let mut eog: Vec<u32> = [s.fim_pad, s.fim_rep, s.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        for text in EOG_TEXTS {
            if let Some(&id) = self.ids.get(*text) {
                eog.push(id);
                self.force_control(id);
            }
        }
        let s = &self.special;
        eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();
        // gpt-oss and Solar Open end a message with <|end|> but keep generating after it: with
        // their <|return|>/<|call|> (or <|calls|>/<|flush|>) present, <|end|> is no stop.
        let has = |t: &str| self.ids.get(t).is_some_and(|id| eog.contains(id));
        if let Some(&end) = self.ids.get("<|end|>").filter(|id| eog.contains(id))
            && ((has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")))
        {
            eog.retain(|&id| id != end);
            self.attrs[end as usize] = attr::USER_DEFINED;
        }
        self.eog = eog;
    }

    /// Per-model attributes llama.cpp sets by name: Phi-3 strips whitespace to the right of its
    /// special tokens (but not of `<unk>`, `<s>`, `<|endoftext|>`).
    fn set_model_attrs(&mut self, general_name: Option<&str>) {
        let name = general_name.unwrap_or_default().to_lowercase();
        if !(name.contains("phi-3") || name.contains("phi3")) {
            return;
        }
        for &id in &self.special_order {
            self.attrs[id as usize] |= attr::RSTRIP;
        }
        if let Some(&id) = self.ids.get("</s>") {
            self.attrs[id as usize] |= attr::RSTRIP;
        }
        for text in ["<unk>", "<s>", "<|endoftext|>"] {
            if let Some(&id) = self.ids.get(text) {
                self.attrs[id as usize] &= !attr::RSTRIP;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// llama.cpp's `byte_to_token` for SentencePiece: `<0xXX>`, else the byte itself as text.
    pub fn spm_byte_token(&self, b: u8) -> Option<u32> {
        self.ids
            .get(&format!("<0x{b:02X}>"))
            .or_else(|| self.ids.get(std::str::from_utf8(&[b]).ok()?))
            .copied()
    }
}
