//! The protobuf codec of every generated service and client: prost's, but
//! a message that does not decode is INVALID_ARGUMENT (the caller sent
//! bytes that are not the request) rather than prost's INTERNAL, which
//! would blame the server. A response a client cannot decode is reported
//! the same way; the message names the decoding error either way.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic_prost::ProstCodec;

/// [`ProstCodec`] with decode errors as INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::default())
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as tonic::codec::Codec>::Encoder;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder(self.0.decoder(), PhantomData)
    }
}

/// The decoder of [`Codec`].
#[derive(Debug)]
pub struct CheckedDecoder<U>(tonic_prost::ProstDecoder<U>, PhantomData<U>);

impl<U: Message + Default> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            Status::invalid_argument(format!(
                "the message is not valid protobuf for this method: {}",
                status.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
