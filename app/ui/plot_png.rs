//! The sweep's trade-off plot as a PNG, drawn without a GPU or a window: egui lays out the same
//! plot as the dashboard in a headless context, and its triangles are rasterized here on the CPU
//! ([`render_ui`] does that for any UI).

use std::collections::HashMap;
use std::path::Path;

use egui::epaint::{ClippedPrimitive, ColorImage, ImageData, Mesh, Primitive, TextureId};
use egui::{Pos2, Rect, ViewportId};

use super::load::SweepPoint;

/// The saved image's size in pixels.
pub const PNG_SIZE: [u32; 2] = [1500, 1000];
/// 1000 × 667 points: text the size it has in the window, drawn crisply.
const PIXELS_PER_POINT: f32 = 1.5;

/// Draws the sweep plot (title, the run's settings, axes with labels, one labelled point per
/// level) into an RGBA image of [`PNG_SIZE`].
pub fn render(points: &[SweepPoint]) -> image::RgbaImage {
    render_ui(PNG_SIZE, |ui| figure_ui(ui, points))
}

/// Draws whatever `add_contents` lays out in a central panel, on a light page, into an RGBA
/// image of `size` pixels.
pub fn render_ui(size: [u32; 2], mut add_contents: impl FnMut(&mut egui::Ui)) -> image::RgbaImage {
    let ctx = egui::Context::default();
    // Light, like a figure on paper.
    ctx.set_theme(egui::Theme::Light);
    let [w, h] = size;
    let mut input = egui::RawInput {
        screen_rect: Some(Rect::from_min_size(
            Pos2::ZERO,
            egui::vec2(w as f32, h as f32) / PIXELS_PER_POINT,
        )),
        ..Default::default()
    };
    input
        .viewports
        .entry(ViewportId::ROOT)
        .or_default()
        .native_pixels_per_point = Some(PIXELS_PER_POINT);
    let mut textures: HashMap<TextureId, ColorImage> = HashMap::new();
    let mut last = None;
    // Plots fit their bounds and the fonts fill their atlas over the first frames.
    for _ in 0..3 {
        let mut out = ctx.run_ui(input.clone(), |ui| {
            egui::CentralPanel::default().show(ui, &mut add_contents);
        });
        apply_textures(&mut textures, &out.textures_delta);
        // Applied to our copy (epaint insists every delta is consumed).
        out.textures_delta.clear();
        last = Some(out);
    }
    let mut canvas = Canvas::new(w as usize, h as usize);
    if let Some(out) = last {
        let ppp = out.pixels_per_point;
        for prim in ctx.tessellate(out.shapes, ppp) {
            canvas.draw(&prim, ppp, &textures);
        }
    }
    canvas.into_image()
}

/// Renders and writes the PNG.
pub fn save(path: &Path, points: &[SweepPoint]) -> Result<(), String> {
    render(points)
        .save_with_format(path, image::ImageFormat::Png)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn figure_ui(ui: &mut egui::Ui, points: &[SweepPoint]) {
    ui.heading("TPS Lab: concurrency sweep");
    if points.is_empty() {
        ui.label("No sweep points.");
        return;
    }
    let height = ui.available_height() - 40.0;
    super::plots::sweep_plot_ui(ui, points, height);
}

fn apply_textures(textures: &mut HashMap<TextureId, ColorImage>, delta: &egui::TexturesDelta) {
    for (id, deltas) in &delta.set {
        for d in deltas {
            let ImageData::Color(img) = &d.image;
            match d.pos {
                None => {
                    textures.insert(*id, (**img).clone());
                }
                Some([x0, y0]) => {
                    let Some(t) = textures.get_mut(id) else {
                        continue;
                    };
                    let [tw, _] = t.size;
                    for y in 0..img.size[1] {
                        for x in 0..img.size[0] {
                            if let Some(px) = t.pixels.get_mut((y0 + y) * tw + x0 + x) {
                                *px = img.pixels[y * img.size[0] + x];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Premultiplied RGBA in 0..=1, over an opaque white page.
struct Canvas {
    w: usize,
    h: usize,
    px: Vec<[f32; 4]>,
}

fn edge(a: Pos2, b: Pos2, p: Pos2) -> f32 {
    (b.x - a.x) * (p.y - a.y) - (b.y - a.y) * (p.x - a.x)
}

/// Whether a pixel centre exactly on edge a->b counts: for exactly one of two triangles sharing
/// the edge (they run it in opposite directions), so translucent seams are not drawn twice.
fn owns_edge(a: Pos2, b: Pos2) -> bool {
    b.y > a.y || (b.y == a.y && b.x > a.x)
}

impl Canvas {
    fn new(w: usize, h: usize) -> Self {
        Self {
            w,
            h,
            px: vec![[1.0; 4]; w * h],
        }
    }

    fn draw(
        &mut self,
        prim: &ClippedPrimitive,
        ppp: f32,
        textures: &HashMap<TextureId, ColorImage>,
    ) {
        let Primitive::Mesh(mesh) = &prim.primitive else {
            return;
        };
        let Some(tex) = textures.get(&mesh.texture_id) else {
            return;
        };
        let clip = Rect::from_min_max(
            (prim.clip_rect.min.to_vec2() * ppp).to_pos2(),
            (prim.clip_rect.max.to_vec2() * ppp).to_pos2(),
        )
        .intersect(Rect::from_min_size(
            Pos2::ZERO,
            egui::vec2(self.w as f32, self.h as f32),
        ));
        if clip.is_negative() {
            return;
        }
        self.mesh(mesh, ppp, tex, clip);
    }

    fn mesh(&mut self, mesh: &Mesh, ppp: f32, tex: &ColorImage, clip: Rect) {
        for tri in mesh.indices.chunks_exact(3) {
            let v = [0, 1, 2].map(|i| mesh.vertices[tri[i] as usize]);
            let mut p = v.map(|v| (v.pos.to_vec2() * ppp).to_pos2());
            let mut v = v;
            let area = edge(p[0], p[1], p[2]);
            if area.abs() < 1e-9 {
                continue;
            }
            if area < 0.0 {
                p.swap(1, 2);
                v.swap(1, 2);
            }
            let area = area.abs();
            let min = p[0].min(p[1]).min(p[2]).max(clip.min);
            let max = p[0].max(p[1]).max(p[2]).min(clip.max);
            let (x0, y0) = (
                min.x.floor().max(0.0) as usize,
                min.y.floor().max(0.0) as usize,
            );
            let (x1, y1) = (max.x.ceil() as usize, max.y.ceil() as usize);
            let edges = [(p[1], p[2]), (p[2], p[0]), (p[0], p[1])];
            for y in y0..y1.min(self.h) {
                for x in x0..x1.min(self.w) {
                    let c = Pos2::new(x as f32 + 0.5, y as f32 + 0.5);
                    let e = edges.map(|(a, b)| edge(a, b, c));
                    let inside = e
                        .iter()
                        .zip(&edges)
                        .all(|(w, (a, b))| *w > 0.0 || (*w == 0.0 && owns_edge(*a, *b)));
                    if !inside {
                        continue;
                    }
                    let w = e.map(|e| e / area);
                    let lerp = |f: &dyn Fn(usize) -> f32| w[0] * f(0) + w[1] * f(1) + w[2] * f(2);
                    let u = lerp(&|i| v[i].uv.x);
                    let t = lerp(&|i| v[i].uv.y);
                    let tx = ((u * tex.size[0] as f32) as usize).min(tex.size[0] - 1);
                    let ty = ((t * tex.size[1] as f32) as usize).min(tex.size[1] - 1);
                    let texel = tex.pixels[ty * tex.size[0] + tx].to_array();
                    let src: [f32; 4] = std::array::from_fn(|k| {
                        lerp(&|i| f32::from(v[i].color.to_array()[k])) / 255.0 * f32::from(texel[k])
                            / 255.0
                    });
                    let dst = &mut self.px[y * self.w + x];
                    for k in 0..4 {
                        dst[k] = src[k] + dst[k] * (1.0 - src[3]);
                    }
                }
            }
        }
    }

    fn into_image(self) -> image::RgbaImage {
        let mut img = image::RgbaImage::new(self.w as u32, self.h as u32);
        for (out, px) in img.pixels_mut().zip(&self.px) {
            let a = px[3].max(1e-6);
            let straight = |c: f32| ((c / a).clamp(0.0, 1.0) * 255.0).round() as u8;
            *out = image::Rgba([
                straight(px[0]),
                straight(px[1]),
                straight(px[2]),
                (a.min(1.0) * 255.0).round() as u8,
            ]);
        }
        img
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_triangles_of_a_translucent_square_cover_each_pixel_once() {
        let mut c = Canvas::new(8, 8);
        let mut mesh = Mesh::default();
        let col = egui::Color32::from_black_alpha(128);
        mesh.add_colored_rect(Rect::from_min_max(Pos2::ZERO, Pos2::new(8.0, 8.0)), col);
        let white = ColorImage::new([1, 1], vec![egui::Color32::WHITE]);
        let clip = Rect::from_min_max(Pos2::ZERO, Pos2::new(8.0, 8.0));
        c.mesh(&mesh, 1.0, &white, clip);
        let first = c.px[0][0];
        assert!(first < 0.6 && first > 0.4, "{first}");
        assert!(c.px.iter().all(|p| (p[0] - first).abs() < 1e-6), "no seam");
    }
}
