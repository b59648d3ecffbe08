//! Which rank this process is, from the environment its launcher set: torchrun's `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` first, then Open MPI's
//! `OMPI_COMM_WORLD_RANK`, `…_SIZE`, `…_LOCAL_RANK`, `…_LOCAL_SIZE` (`mpirun`), then Slurm's
//! `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE` (`srun`). Without
//! a rank and a world size from one of them the process is rank 0 of 1.

use serde::Serialize;

use crate::error::{Error, Result};

/// The launcher that started the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Launcher {
    /// None: one process.
    None,
    /// `torchrun` / `accelerate launch`.
    Torchrun,
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// Slurm's `srun`.
    Slurm,
}

/// This process's place among the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Launch {
    /// Who set the variables.
    pub launcher: Launcher,
    /// This process, `0..world`.
    pub rank: usize,
    /// Processes in all.
    pub world: usize,
    /// This process among those of its node (the device `cuda:LOCAL_RANK` on GPUs).
    pub local_rank: usize,
    /// Processes on this node.
    pub local_world: usize,
}

impl Launch {
    /// One process alone.
    pub const ALONE: Launch = Launch {
        launcher: Launcher::None,
        rank: 0,
        world: 1,
        local_rank: 0,
        local_world: 1,
    };

    /// From this process's environment.
    pub fn from_env() -> Result<Launch> {
        Launch::from_vars(|name| std::env::var(name).ok())
    }

    /// From the variables `var` returns.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let schemes = [
            (
                Launcher::Torchrun,
                ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
            ),
            (
                Launcher::OpenMpi,
                [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                ],
            ),
            (
                Launcher::Slurm,
                [
                    "SLURM_PROCID",
                    "SLURM_NTASKS",
                    "SLURM_LOCALID",
                    "SLURM_NTASKS_PER_NODE",
                ],
            ),
        ];
        for (launcher, [rank, world, local_rank, local_world]) in schemes {
            // A launcher sets both; one alone (a stray `RANK` in a shell) names no launch.
            let (Some(rank_text), Some(world_text)) = (var(rank), var(world)) else {
                continue;
            };
            let number = |name: &str, text: Option<String>| -> Result<Option<usize>> {
                text.map(|t| {
                    // Slurm writes `2(x3)` for a per-node count repeated over nodes.
                    let head = t.split('(').next().unwrap_or("").trim().to_string();
                    head.parse::<usize>().map_err(|_| {
                        Error::Input(format!(
                            "environment variable {name}={t:?}: expected a whole number"
                        ))
                    })
                })
                .transpose()
            };
            let rank_value = number(rank, Some(rank_text))?.unwrap_or(0);
            let world_value = number(world, Some(world_text))?.unwrap_or(1);
            let local_rank_value = number(local_rank, var(local_rank))?.unwrap_or(rank_value);
            let local_world_value = number(local_world, var(local_world))?.unwrap_or(world_value);
            if world_value == 0 || rank_value >= world_value {
                return Err(Error::Input(format!(
                    "environment variables {rank}={rank_value}, {world}={world_value}: the rank must be below the world size"
                )));
            }
            return Ok(Launch {
                launcher,
                rank: rank_value,
                world: world_value,
                local_rank: local_rank_value,
                local_world: local_world_value,
            });
        }
        Ok(Launch::ALONE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn each_launcher_s_variables_name_the_rank() {
        assert_eq!(Launch::from_vars(vars(&[])).unwrap(), Launch::ALONE);
        let torchrun = Launch::from_vars(vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "0"),
        ]))
        .unwrap();
        assert_eq!(
            (
                torchrun.launcher,
                torchrun.rank,
                torchrun.world,
                torchrun.local_rank
            ),
            (Launcher::Torchrun, 3, 4, 1)
        );
        let mpi = Launch::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]))
        .unwrap();
        assert_eq!(
            (mpi.launcher, mpi.rank, mpi.world),
            (Launcher::OpenMpi, 1, 2)
        );
        let slurm = Launch::from_vars(vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "4(x2)"),
        ]))
        .unwrap();
        assert_eq!(
            (slurm.launcher, slurm.rank, slurm.local_world),
            (Launcher::Slurm, 5, 4)
        );
    }

    #[test]
    fn bad_variables_are_named() {
        let err = Launch::from_vars(vars(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(err.to_string().contains("RANK=\"x\""), "{err}");
        let err = Launch::from_vars(vars(&[("RANK", "2"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(err.to_string().contains("below the world size"), "{err}");
        // A rank without a world size is no launch.
        let stray = Launch::from_vars(vars(&[("RANK", "3")])).unwrap();
        assert_eq!(stray, Launch::ALONE);
    }
}
