//! One table of spellings per option: the canonical name of each value, the other spellings it
//! accepts and one line of help, written once and used everywhere a value is read or written.
//!
//! `spellings!` turns a table into `ALL`, `name()`, `Display`, `FromStr` (case-insensitive,
//! aliases accepted, an error that lists the names), optionally serde by name (TOML run files,
//! JSON reports), and, with the `clap` feature, `clap::ValueEnum`: the CLI's flags take the
//! enum itself, `--help` lists the values and their help, and completion offers them.

/// Implements the spellings of a fieldless enum from one table:
///
/// ```ignore
/// spellings! {
///     // the enum, what an error calls a value, the setting (a run file's key; the flag is
///     // the same with dashes), and whether serde reads and writes it by name
///     ComputeDtype, "precision", "dtype", serde;
///     F32 => "f32" ["fp32", "float32"]: "everything in f32",
///     Bf16 => "bf16" ["bfloat16"]: "bf16 autocast",
/// }
/// ```
///
/// The optional `serde` marker also implements `Serialize` (the canonical name) and
/// `Deserialize` (any spelling).
macro_rules! spellings {
    (
        $ty:ident, $what:literal, $setting:literal $(, $serde:ident)?;
        $($variant:ident => $name:literal [$($alias:literal),* $(,)?] : $help:literal),+ $(,)?
    ) => {
        impl $ty {
            /// Every value, in the order `--help` lists them.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The canonical spelling.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }

            /// The other spellings accepted for this value.
            pub fn aliases(self) -> &'static [&'static str] {
                match self {
                    $($ty::$variant => &[$($alias),*]),+
                }
            }

            /// One line on what this value does.
            pub fn help(self) -> &'static str {
                match self {
                    $($ty::$variant => $help),+
                }
            }

            /// The canonical names, as an error or a doc lists them: `a, b or c`.
            pub fn expected() -> String {
                let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
                match names.split_last() {
                    Some((last, [])) => (*last).to_string(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::error::Error;

            fn from_str(s: &str) -> $crate::error::Result<Self> {
                let wanted = s.trim();
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| {
                        v.name().eq_ignore_ascii_case(wanted)
                            || v.aliases().iter().any(|a| a.eq_ignore_ascii_case(wanted))
                    })
                    .ok_or_else(|| {
                        $crate::error::Error::config(
                            $setting,
                            format!("unknown {} `{s}`: expected {}", $what, Self::expected()),
                        )
                    })
            }
        }

        #[cfg(feature = "clap")]
        impl clap::ValueEnum for $ty {
            fn value_variants<'a>() -> &'a [Self] {
                Self::ALL
            }

            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                Some(
                    clap::builder::PossibleValue::new(self.name())
                        .aliases(self.aliases().iter().copied())
                        .help(self.help()),
                )
            }
        }

        $($crate::config::spellings!(@$serde $ty);)?
    };
    (@serde $ty:ident) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(
                &self,
                serializer: S,
            ) -> ::std::result::Result<S::Ok, S::Error> {
                serializer.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(
                deserializer: D,
            ) -> ::std::result::Result<Self, D::Error> {
                let text = <::std::string::String as serde::Deserialize>::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use spellings;

#[cfg(test)]
mod tests {
    /// A value of the tests' own.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Colour {
        Red,
        DarkBlue,
    }

    spellings! {
        Colour, "colour", "colour", serde;
        Red => "red" ["rouge"]: "the first",
        DarkBlue => "dark-blue" ["navy", "dark_blue"]: "the second",
    }

    #[test]
    fn every_spelling_reads_back_and_the_canonical_one_is_written() {
        for (text, value) in [
            ("red", Colour::Red),
            ("RED", Colour::Red),
            ("rouge", Colour::Red),
            ("dark-blue", Colour::DarkBlue),
            ("Navy", Colour::DarkBlue),
            ("dark_blue", Colour::DarkBlue),
        ] {
            assert_eq!(text.parse::<Colour>().unwrap(), value, "{text}");
        }
        assert_eq!(Colour::DarkBlue.to_string(), "dark-blue");
        assert_eq!(
            serde_json::to_string(&Colour::DarkBlue).unwrap(),
            "\"dark-blue\""
        );
        assert_eq!(
            serde_json::from_str::<Colour>("\"navy\"").unwrap(),
            Colour::DarkBlue
        );
    }

    #[test]
    fn an_unknown_spelling_is_refused_with_the_names() {
        let error = "green".parse::<Colour>().unwrap_err().to_string();
        assert!(
            error.contains("colour: ")
                && error.contains("unknown colour `green`: expected red or dark-blue"),
            "{error}"
        );
        let error = serde_json::from_str::<Colour>("\"green\"")
            .unwrap_err()
            .to_string();
        assert!(error.contains("expected red or dark-blue"), "{error}");
    }
}
