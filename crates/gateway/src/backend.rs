//! The generic gRPC client the gateway transcodes to: a tonic channel to the
//! node's own gRPC port and a pass-through codec, so request and response
//! messages travel as already-encoded bytes. The gateway never links the
//! service implementation: REST goes through the very same tower stack
//! (deadline, load shedding, size limits) as any gRPC caller.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status, Streaming};

use crate::Error;

/// A client for any unary or server-streaming RPC of the target.
#[derive(Debug, Clone)]
pub struct Backend {
    channel: Channel,
    max_message_bytes: usize,
}

impl Backend {
    /// A client for `target` (e.g. `http://127.0.0.1:50051`). Connects
    /// lazily, so the gateway can start before the gRPC server listens.
    pub fn new(target: &str, max_message_bytes: usize) -> Result<Self, Error> {
        let endpoint = Endpoint::from_shared(target.to_string())
            .map_err(|_| Error::Target(target.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        Ok(Self {
            channel: endpoint.connect_lazy(),
            max_message_bytes,
        })
    }

    /// A client over an existing channel.
    pub fn from_channel(channel: Channel, max_message_bytes: usize) -> Self {
        Self {
            channel,
            max_message_bytes,
        }
    }

    fn grpc(&self) -> tonic::client::Grpc<Channel> {
        tonic::client::Grpc::new(self.channel.clone())
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes)
    }

    /// Calls a unary RPC with an encoded request; returns the encoded response.
    pub async fn unary(
        &self,
        path: PathAndQuery,
        metadata: MetadataMap,
        body: Bytes,
    ) -> Result<Bytes, Status> {
        let mut grpc = self.grpc();
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("the gRPC service is not reachable: {e}")))?;
        let request = Request::from_parts(metadata, Default::default(), body);
        Ok(grpc.unary(request, path, BytesCodec).await?.into_inner())
    }

    /// Calls a server-streaming RPC; the stream yields encoded messages.
    pub async fn server_streaming(
        &self,
        path: PathAndQuery,
        metadata: MetadataMap,
        body: Bytes,
    ) -> Result<Streaming<Bytes>, Status> {
        let mut grpc = self.grpc();
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("the gRPC service is not reachable: {e}")))?;
        let request = Request::from_parts(metadata, Default::default(), body);
        Ok(grpc
            .server_streaming(request, path, BytesCodec)
            .await?
            .into_inner())
    }
}

/// Passes message bytes through untouched in both directions.
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCodec;

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesCodec;
    type Decoder = BytesCodec;

    fn encoder(&mut self) -> Self::Encoder {
        BytesCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesCodec
    }
}

impl Encoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
