//! `napkin bench matmul`: f32 GEMM throughput on the shapes that dominate training a
//! SmolLM2-sized model (256 tokens × 576 → 1536 for the MLP, × 49152 for the LM head) and a
//! square 1024³ one, on every CPU backend compiled in; with `--page-shapes`, the shapes the
//! browser sandbox times, on burn Flex (the page's backend) on one thread (the page has one),
//! so the page's figures can be put beside the native build's (`scripts/bench/page.sh`).

use anyhow::{Context, Result};
use burn::tensor::Device;
use napkin_core::device::DeviceKind;
use napkin_core::io::atomic::write_atomic;
use napkin_core::measure::{GemmShape, PAGE_GEMM_SHAPES, Product, gemm_gflops, page_gemm_figures};

use crate::cli::BenchArgs;

const PRODUCTS: [Product; 2] = [Product::AB, Product::XWt];

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.page_shapes {
        return page_shapes(args);
    }
    let shapes = [(256, 576, 1536), (256, 576, 49_152), (1024, 1024, 1024)];
    println!(
        "f32 matmul, GFLOP/s (median of {} runs after a warm-up; threads: rayon default)",
        args.runs
    );
    print_header(&shapes);
    for kind in DeviceKind::cpu_backends() {
        let device = kind.open()?;
        print_rows(kind.backend_name(), &device, &shapes, args.runs);
    }
    Ok(())
}

/// The page's shapes on Flex, one thread; `--json FILE` also writes them.
fn page_shapes(args: &BenchArgs) -> Result<()> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .context("starting a one-thread pool")?;
    println!(
        "f32 matmul at the page's shapes, GFLOP/s (burn Flex, one thread, native; median of {} \
         runs after a warm-up)",
        args.runs
    );
    let figures = pool.install(|| page_gemm_figures(&Device::flex(), args.runs));
    print_header(&PAGE_GEMM_SHAPES);
    for row in figures.chunks(PAGE_GEMM_SHAPES.len()) {
        print!("{:<34}", format!("burn-flex (native) {}", row[0].product));
        for figure in row {
            print!("{:>18.2}", figure.gflops);
        }
        println!();
    }
    if let Some(path) = &args.json {
        write_atomic(path, &serde_json::to_vec_pretty(&figures)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn print_header(shapes: &[GemmShape]) {
    print!("{:<34}", "backend");
    for (m, k, n) in shapes {
        print!("{:>18}", format!("{m}x{k}x{n}"));
    }
    println!();
}

fn print_rows(backend: &str, device: &Device, shapes: &[GemmShape], runs: usize) {
    for product in PRODUCTS {
        print!("{:<34}", format!("{backend} {}", product.label()));
        for &shape in shapes {
            print!("{:>18.1}", gemm_gflops(device, product, shape, runs));
        }
        println!();
    }
}
