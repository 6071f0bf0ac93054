//! The recording device, a test double: runs a recipe and lists every op it issues with its
//! buffers and the shapes of its weights. Wrapped around a real device ([`Recording::around`])
//! it passes each op on and lists it too, so a test holds the CPU's (or, on a GPU machine,
//! CUDA's) op sequence against the shape-only one for every architecture.

use std::convert::Infallible;

use crate::model::ops::{Activation, AttnOpts, Buf, Heads, Ops, Param, ParamShape, Rope};
use crate::model::weights::MoeWeights;

/// One op as the recipe issued it.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Embed {
        table: ParamShape,
        out: Buf,
    },
    RmsNorm {
        x: Buf,
        w: ParamShape,
        eps: f32,
        out: Buf,
    },
    AddRmsNorm {
        x: Buf,
        y: Buf,
        w: ParamShape,
        eps: f32,
        out: Buf,
    },
    Linear {
        w: ParamShape,
        x: Buf,
        y: Buf,
    },
    Scale {
        x: Buf,
        s: f32,
    },
    Softcap {
        x: Buf,
        cap: f32,
    },
    QkNorm {
        qkv: Buf,
        heads: Heads,
        q: ParamShape,
        k: ParamShape,
        eps: f32,
    },
    RopeStore {
        layer: usize,
        qkv: Buf,
        heads: Heads,
        rope: Option<Rope>,
        factors: Option<ParamShape>,
    },
    Attention {
        layer: usize,
        qkv: Buf,
        heads: Heads,
        opts: AttnOpts,
        /// The sinks' shape (one per query head), when the layer has them.
        sinks: Option<ParamShape>,
        out: Buf,
    },
    GatedFfn {
        gate_up: ParamShape,
        down: ParamShape,
        act: Activation,
        x: Buf,
        out: Buf,
    },
    MoeFfn {
        router: ParamShape,
        /// The first expert's gate-up and down (every expert has the same shape).
        gate_up: ParamShape,
        down: ParamShape,
        n_expert: usize,
        rule: tpslab_kernels::moe::Router,
        act: Activation,
        x: Buf,
        out: Buf,
    },
    Add {
        x: Buf,
        y: Buf,
    },
    GatherRmsNorm {
        x: Buf,
        w: ParamShape,
        eps: f32,
        out: Buf,
    },
    Logits {
        head: ParamShape,
        x: Buf,
        out: Buf,
    },
}

/// A device that does nothing: the recipe runs on weight shapes alone.
pub struct NoDevice;

/// Lists the ops run through it, passing each to `inner` first.
pub struct Recording<O = NoDevice> {
    inner: O,
    pub ops: Vec<Op>,
}

impl Recording<NoDevice> {
    pub fn new() -> Self {
        Self::around(NoDevice)
    }
}

impl Default for Recording<NoDevice> {
    fn default() -> Self {
        Self::new()
    }
}

impl<O> Recording<O> {
    pub fn around(inner: O) -> Self {
        Self {
            inner,
            ops: Vec::new(),
        }
    }

    pub fn into_parts(self) -> (O, Vec<Op>) {
        (self.inner, self.ops)
    }
}

impl Ops for NoDevice {
    type Matrix = ParamShape;
    type Vector = ParamShape;
    type Error = Infallible;

    fn embed(&mut self, _: &ParamShape, _: Buf) -> Result<(), Infallible> {
        Ok(())
    }
    fn rms_norm(&mut self, _: Buf, _: &ParamShape, _: f32, _: Buf) -> Result<(), Infallible> {
        Ok(())
    }
    fn add_rms_norm(
        &mut self,
        _: Buf,
        _: Buf,
        _: &ParamShape,
        _: f32,
        _: Buf,
    ) -> Result<(), Infallible> {
        Ok(())
    }
    fn linear(&mut self, _: &ParamShape, _: Buf, _: Buf) -> Result<(), Infallible> {
        Ok(())
    }
    fn scale(&mut self, _: Buf, _: f32) -> Result<(), Infallible> {
        Ok(())
    }
    fn softcap(&mut self, _: Buf, _: f32) -> Result<(), Infallible> {
        Ok(())
    }
    fn qk_norm(
        &mut self,
        _: Buf,
        _: Heads,
        _: &ParamShape,
        _: &ParamShape,
        _: f32,
    ) -> Result<(), Infallible> {
        Ok(())
    }
    fn rope_store(
        &mut self,
        _: usize,
        _: Buf,
        _: Heads,
        _: Option<Rope>,
        _: Option<&ParamShape>,
    ) -> Result<(), Infallible> {
        Ok(())
    }
    fn attention(
        &mut self,
        _: usize,
        _: Buf,
        _: Heads,
        _: AttnOpts,
        _: Option<&ParamShape>,
        _: Buf,
    ) -> Result<(), Infallible> {
        Ok(())
    }
    fn gated_ffn(
        &mut self,
        _: &ParamShape,
        _: &ParamShape,
        _: Activation,
        _: Buf,
        _: Buf,
    ) -> Result<(), Infallible> {
        Ok(())
    }
    fn moe_ffn(
        &mut self,
        _: &MoeWeights<ParamShape>,
        _: Activation,
        _: Buf,
        _: Buf,
    ) -> Result<(), Infallible> {
        Ok(())
    }
    fn add(&mut self, _: Buf, _: Buf) -> Result<(), Infallible> {
        Ok(())
    }
    fn gather_rms_norm(
        &mut self,
        _: Buf,
        _: &ParamShape,
        _: f32,
        _: Buf,
    ) -> Result<(), Infallible> {
        Ok(())
    }
    fn logits(&mut self, _: &ParamShape, _: Buf, _: Buf) -> Result<(), Infallible> {
        Ok(())
    }
}

impl<O: Ops> Ops for Recording<O> {
    type Matrix = O::Matrix;
    type Vector = O::Vector;
    type Error = O::Error;

    fn embed(&mut self, table: &O::Matrix, out: Buf) -> Result<(), O::Error> {
        self.inner.embed(table, out)?;
        self.ops.push(Op::Embed {
            table: table.shape(),
            out,
        });
        Ok(())
    }

    fn rms_norm(&mut self, x: Buf, w: &O::Vector, eps: f32, out: Buf) -> Result<(), O::Error> {
        self.inner.rms_norm(x, w, eps, out)?;
        self.ops.push(Op::RmsNorm {
            x,
            w: w.shape(),
            eps,
            out,
        });
        Ok(())
    }

    fn add_rms_norm(
        &mut self,
        x: Buf,
        y: Buf,
        w: &O::Vector,
        eps: f32,
        out: Buf,
    ) -> Result<(), O::Error> {
        self.inner.add_rms_norm(x, y, w, eps, out)?;
        self.ops.push(Op::AddRmsNorm {
            x,
            y,
            w: w.shape(),
            eps,
            out,
        });
        Ok(())
    }

    fn linear(&mut self, w: &O::Matrix, x: Buf, y: Buf) -> Result<(), O::Error> {
        self.inner.linear(w, x, y)?;
        self.ops.push(Op::Linear { w: w.shape(), x, y });
        Ok(())
    }

    fn scale(&mut self, x: Buf, s: f32) -> Result<(), O::Error> {
        self.inner.scale(x, s)?;
        self.ops.push(Op::Scale { x, s });
        Ok(())
    }

    fn softcap(&mut self, x: Buf, cap: f32) -> Result<(), O::Error> {
        self.inner.softcap(x, cap)?;
        self.ops.push(Op::Softcap { x, cap });
        Ok(())
    }

    fn qk_norm(
        &mut self,
        qkv: Buf,
        heads: Heads,
        q: &O::Vector,
        k: &O::Vector,
        eps: f32,
    ) -> Result<(), O::Error> {
        self.inner.qk_norm(qkv, heads, q, k, eps)?;
        self.ops.push(Op::QkNorm {
            qkv,
            heads,
            q: q.shape(),
            k: k.shape(),
            eps,
        });
        Ok(())
    }

    fn rope_store(
        &mut self,
        layer: usize,
        qkv: Buf,
        heads: Heads,
        rope: Option<Rope>,
        factors: Option<&O::Vector>,
    ) -> Result<(), O::Error> {
        self.inner.rope_store(layer, qkv, heads, rope, factors)?;
        self.ops.push(Op::RopeStore {
            layer,
            qkv,
            heads,
            rope,
            factors: factors.map(Param::shape),
        });
        Ok(())
    }

    fn attention(
        &mut self,
        layer: usize,
        qkv: Buf,
        heads: Heads,
        opts: AttnOpts,
        sinks: Option<&O::Vector>,
        out: Buf,
    ) -> Result<(), O::Error> {
        self.inner.attention(layer, qkv, heads, opts, sinks, out)?;
        self.ops.push(Op::Attention {
            layer,
            qkv,
            heads,
            opts,
            sinks: sinks.map(Param::shape),
            out,
        });
        Ok(())
    }

    fn gated_ffn(
        &mut self,
        gate_up: &O::Matrix,
        down: &O::Matrix,
        act: Activation,
        x: Buf,
        out: Buf,
    ) -> Result<(), O::Error> {
        self.inner.gated_ffn(gate_up, down, act, x, out)?;
        self.ops.push(Op::GatedFfn {
            gate_up: gate_up.shape(),
            down: down.shape(),
            act,
            x,
            out,
        });
        Ok(())
    }

    fn moe_ffn(
        &mut self,
        moe: &MoeWeights<O::Matrix>,
        act: Activation,
        x: Buf,
        out: Buf,
    ) -> Result<(), O::Error> {
        self.inner.moe_ffn(moe, act, x, out)?;
        let first = |f: fn(&crate::model::weights::Expert<O::Matrix>) -> &O::Matrix| {
            moe.experts
                .first()
                .map_or(ParamShape::Vector(0), |e| f(e).shape())
        };
        self.ops.push(Op::MoeFfn {
            router: moe.router.shape(),
            gate_up: first(|e| &e.gate_up),
            down: first(|e| &e.down),
            n_expert: moe.experts.len(),
            rule: moe.rule,
            act,
            x,
            out,
        });
        Ok(())
    }

    fn add(&mut self, x: Buf, y: Buf) -> Result<(), O::Error> {
        self.inner.add(x, y)?;
        self.ops.push(Op::Add { x, y });
        Ok(())
    }

    fn gather_rms_norm(
        &mut self,
        x: Buf,
        w: &O::Vector,
        eps: f32,
        out: Buf,
    ) -> Result<(), O::Error> {
        self.inner.gather_rms_norm(x, w, eps, out)?;
        self.ops.push(Op::GatherRmsNorm {
            x,
            w: w.shape(),
            eps,
            out,
        });
        Ok(())
    }

    fn logits(&mut self, head: &O::Matrix, x: Buf, out: Buf) -> Result<(), O::Error> {
        self.inner.logits(head, x, out)?;
        self.ops.push(Op::Logits {
            head: head.shape(),
            x,
            out,
        });
        Ok(())
    }
}
