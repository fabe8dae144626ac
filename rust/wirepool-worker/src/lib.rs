pub use wirepool_codec::Codec;
