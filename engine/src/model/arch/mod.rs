//! The model families the engine runs, and their registry. A family is one module here that
//! owns everything the engine knows of it: the GGUF architectures it reads and their RoPE
//! layout, the quirks it resolves from their metadata keys, its weights by tensor name, its
//! Hugging Face classes and their mapping (as convert_hf_to_gguf.py maps them), its tiny
//! random models (what it is held against llama.cpp with), its known shapes for synthetic
//! weights, and its recipe, written once against the backend-ops
//! seam ([`crate::model::ops::Ops`]) the way llama.cpp's `src/models/*.cpp` graph builders
//! describe each family (done eagerly here, op by op).
//!
//! Modules:
//! - [`family`]: the contract a family module fills in ([`FamilyDef`]) and its plain types.
//! - [`resolve`]: a file's configuration from its metadata, the family's quirks included.
//! - the families: [`llama`] (Llama 2/3, Mistral, SmolLM 1-2, Mixtral-style experts; its
//!   `block` is the pre-norm recipe most families run), [`qwen2`], [`qwen3`] (and Qwen3-MoE),
//!   [`phi3`], [`smollm3`], [`gemma`] (Gemma 2 and 3), [`gptoss`] and [`granite`].
//!
//! ## Adding a family
//! Write `model/arch/<family>.rs` (or a folder) with a unit struct `Def` implementing
//! [`FamilyDef`] (its GGUF architectures, its tiny model, its Hugging Face classes if it runs
//! from a folder, and whatever it adds to the plain block, its loader included: the defaults
//! are the Llama block's) and a `pub fn forward<O: Ops>(cfg, weights, ops)`, its
//! recipe (most families call [`llama::block::forward`] and add what they need in their
//! weights or configuration); then add one line `NAME => module` to the registry below.
//! Nothing else changes: the resolver, the loaders, the devices and the tests that walk
//! [`Family::ALL`] find it there.

use crate::formats::gguf::GgufFile;
pub use crate::model::config::Family;
use crate::model::config::{ConfigError, ModelConfig};
use crate::model::ops::Ops;
use crate::model::weights::{WeightError, Weights};
pub use family::{FamilyDef, GgufArch, HfClass, KnownShape};

pub mod family;
pub mod resolve;

/// Declares the family modules and names each one on [`Family`] (`Family::LLAMA` for the
/// line `LLAMA => llama`), its definition and its recipe.
macro_rules! registry {
    ($($id:ident => $module:ident),+ $(,)?) => {
        $(pub mod $module;)+

        impl Family {
            registry!(@consts 0u8; $($id)+);

            /// Every family, in the registry's order.
            pub const ALL: &'static [Family] = &[$(Family::$id),+];

            /// What the family's module says of it.
            pub fn def(self) -> &'static dyn FamilyDef {
                match self {
                    $(Family::$id => &$module::Def,)+
                    Family(n) => unreachable!("family {n} is not in the registry"),
                }
            }

            /// The family's module name ("llama").
            pub fn name(self) -> &'static str {
                match self {
                    $(Family::$id => stringify!($module),)+
                    Family(n) => unreachable!("family {n} is not in the registry"),
                }
            }
        }

        /// One forward step of `cfg`'s family on device `o`: every token of the step through
        /// every layer, then the logits of the rows that want them.
        pub fn forward<O: Ops>(
            cfg: &ModelConfig,
            w: &Weights<O::Matrix, O::Vector>,
            o: &mut O,
        ) -> Result<(), O::Error> {
            match cfg.family {
                $(Family::$id => $module::forward(cfg, w, o),)+
                Family(n) => unreachable!("family {n} is not in the registry"),
            }
        }
    };
    (@consts $n:expr; $id:ident $($rest:ident)*) => {
        pub const $id: Family = Family($n);
        registry!(@consts $n + 1; $($rest)*);
    };
    (@consts $n:expr;) => {};
}

registry! {
    LLAMA => llama,
    QWEN2 => qwen2,
    QWEN3 => qwen3,
    PHI3 => phi3,
    SMOLLM3 => smollm3,
    GEMMA => gemma,
    GPT_OSS => gptoss,
    GRANITE => granite,
}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What every family lists under `pick` (its architectures, classes, tiny models, shapes),
/// each with its family, in the registry's order.
pub fn listed<T: 'static>(
    pick: fn(&dyn FamilyDef) -> &'static [T],
) -> impl Iterator<Item = (Family, &'static T)> {
    Family::ALL
        .iter()
        .flat_map(move |&f| pick(f.def()).iter().map(move |t| (f, t)))
}

/// Every GGUF architecture the engine runs, with the family that runs it.
pub fn archs() -> impl Iterator<Item = (Family, &'static GgufArch)> {
    listed(|d| d.gguf_archs())
}

/// The family of a GGUF `general.architecture`, if the engine runs it (the library's import
/// check asks this too, so a model it admits is one that loads).
pub fn lookup(name: &str) -> Option<(Family, &'static GgufArch)> {
    archs().find(|(_, a)| a.name == name)
}

/// The GGUF architectures the engine runs, for messages ("llama, mistral, ...").
pub fn names() -> String {
    archs().map(|(_, a)| a.name).collect::<Vec<_>>().join(", ")
}

/// Every Hugging Face class the engine runs from a folder, with its family.
pub fn hf_classes() -> impl Iterator<Item = (Family, &'static HfClass)> {
    listed(|d| d.hf_classes())
}

/// The class of a `config.json`: its `architectures[0]` (what the converter dispatches on),
/// else its `model_type`; the name found when the engine does not run it.
pub fn hf_class_of(
    model_type: Option<&str>,
    architectures: &[String],
) -> Result<(Family, &'static HfClass), UnknownClass> {
    if let Some(a) = architectures.first() {
        return hf_classes()
            .find(|(_, c)| c.class == a)
            .ok_or_else(|| UnknownClass(a.clone()));
    }
    let ty = model_type.unwrap_or_default();
    hf_classes()
        .find(|(_, c)| c.model_types.contains(&ty))
        .ok_or_else(|| UnknownClass(ty.to_string()))
}

/// A Hugging Face class (or model type) no family runs: the name found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model type '{0}' is not supported (supported: {supported})", supported = hf_names())]
pub struct UnknownClass(pub String);

/// The Hugging Face class names, for messages.
pub fn hf_names() -> String {
    hf_classes()
        .map(|(_, c)| c.class)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error for an architecture no family runs.
pub fn unsupported(name: &str) -> ConfigError {
    ConfigError::Arch(name.to_string(), names())
}

/// Runs the model's loader over `file`'s headers alone: every tensor it needs found, with its
/// shape and a type the kernels run, and no data read. What `models import` asks of a model
/// before it enters the library; a file that passes can fail to load only by its data
/// (truncated, unreadable).
pub fn probe(file: &GgufFile, cfg: &ModelConfig) -> Result<(), WeightError> {
    let _probing = crate::model::weights::Probing::start();
    cfg.family.def().load(file, cfg).map(drop)
}

/// The weights of `cfg`'s family from `file`, in one arena ([`Weights::into_arena`]).
pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
    Ok(cfg.family.def().load(file, cfg)?.into_arena())
}
