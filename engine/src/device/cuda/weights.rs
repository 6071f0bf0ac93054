//! The model's weights on a GPU: each matrix uploaded in its file format ([`DevLinear`]), each
//! norm weight as floats ([`DevVector`]), except the experts `--n-cpu-moe` keeps in host memory,
//! which stay the host's matrices and are run by the CPU (see `ops::CudaOps::moe_ffn`).

use std::collections::HashSet;

use tpslab_kernels::cuda::{CudaError, DBuf, DevMatrix, Feature, GemmScratch, Gpu, Unsupported};

use super::cuda;
use crate::device::BackendError;
use crate::model::ops::{Param, ParamShape};
use crate::model::weights::{Linear, Weights};

/// A matrix for the GPU's recipe: on the device, or (an expert under `--n-cpu-moe`) left in host
/// memory for the CPU.
pub struct DevLinear {
    pub(super) m: DevMatrix,
    pub(super) bias: Option<DBuf>,
    store: Store,
}

enum Store {
    Device(#[allow(dead_code)] DBuf),
    Host(Linear),
}

impl DevLinear {
    fn upload(gpu: &Gpu, l: &Linear) -> Result<Self, CudaError> {
        let data = gpu.upload(&l.ggml_bytes())?;
        let bias = l.bias.as_ref().map(|b| gpu.upload(b)).transpose()?;
        Ok(Self {
            m: DevMatrix {
                ty: l.ty,
                n: l.n,
                k: l.k,
                ptr: data.ptr(),
            },
            bias,
            store: Store::Device(data),
        })
    }

    /// `l` left in host memory (its bytes shared, not copied).
    fn on_host(l: &Linear) -> Self {
        Self {
            m: DevMatrix {
                ty: l.ty,
                n: l.n,
                k: l.k,
                ptr: 0,
            },
            bias: None,
            store: Store::Host(l.clone()),
        }
    }

    /// Bytes of the matrix and its bias, as the host counts a matrix ([`Linear::bytes`]).
    pub(super) fn bytes(&self) -> usize {
        match &self.store {
            Store::Host(l) => l.bytes(),
            Store::Device(_) => {
                self.m.row_bytes() * self.m.n + self.bias.as_ref().map_or(0, DBuf::len)
            }
        }
    }

    /// The host's matrix when this one stayed in host memory.
    pub(super) fn host(&self) -> Option<&Linear> {
        match &self.store {
            Store::Host(l) => Some(l),
            Store::Device(_) => None,
        }
    }

    pub(super) fn forward(
        &self,
        gpu: &Gpu,
        x: u64,
        m: usize,
        y: u64,
        scratch: &mut GemmScratch,
    ) -> Result<(), CudaError> {
        if self.host().is_some() {
            return Err(Unsupported(Feature::HostMatrix).into());
        }
        gpu.matmul(&self.m, x, m, y, scratch)?;
        if let Some(b) = &self.bias {
            gpu.add_bias(y, b.ptr(), self.m.n, m)?;
        }
        Ok(())
    }
}

impl Param for DevLinear {
    fn shape(&self) -> ParamShape {
        ParamShape::Matrix {
            ty: self.m.ty,
            n: self.m.n,
            k: self.m.k,
            bias: self.bias.is_some() || self.host().is_some_and(|l| l.bias.is_some()),
        }
    }
}

/// A norm weight on the device, with its length.
pub struct DevVector {
    pub(super) buf: DBuf,
    pub(super) len: usize,
}

impl Param for DevVector {
    fn shape(&self) -> ParamShape {
        ParamShape::Vector(self.len)
    }
}

/// The weights on the device: the host [`Weights`] structure of device buffers.
pub(super) type DevWeights = Weights<DevLinear, DevVector>;

/// Which of a model's matrices stay in host memory: the experts of its first `cpu_moe_layers`
/// blocks (each matrix by its address in the host's weights, which it keeps while uploading).
pub(super) struct Placement {
    host: HashSet<usize>,
    /// Bytes of the matrices kept in host memory.
    pub(super) host_bytes: usize,
}

impl Placement {
    pub(super) fn new(w: &Weights, cpu_moe_layers: usize) -> Self {
        let kept: Vec<&Linear> = w.leading_experts(cpu_moe_layers).collect();
        Self {
            host_bytes: kept.iter().map(|l| l.bytes()).sum(),
            host: kept
                .into_iter()
                .map(|l| l as *const Linear as usize)
                .collect(),
        }
    }

    fn on_host(&self, l: &Linear) -> bool {
        self.host.contains(&(l as *const Linear as usize))
    }

    /// Refuses, before touching a GPU, weights the device would run of a type the CUDA kernels
    /// do not read (Q5_K), or stacked of several types. Matrices kept in host memory are the
    /// CPU's and take any type it reads.
    pub(super) fn check_types(&self, w: &Weights) -> Result<(), BackendError> {
        for l in w.matrices().filter(|l| !self.on_host(l)) {
            if l.parts.len() > 1 {
                return Err(BackendError::MixedTypes(l.types()));
            }
            tpslab_kernels::cuda::check_type(l.ty).map_err(cuda("checking the weight types"))?;
        }
        Ok(())
    }

    /// Uploads `w`, leaving the host's matrices where they are.
    pub(super) fn upload(&self, gpu: &Gpu, w: &Weights) -> Result<DevWeights, CudaError> {
        w.try_map(
            |l| match self.on_host(l) {
                true => Ok(DevLinear::on_host(l)),
                false => DevLinear::upload(gpu, l),
            },
            |v| {
                Ok(DevVector {
                    buf: gpu.upload(v)?,
                    len: v.len(),
                })
            },
        )
    }
}
