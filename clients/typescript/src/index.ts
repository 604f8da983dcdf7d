/**
 * toolwire's TypeScript client: tool calls over one WebSocket, at most once per call id,
 * resumed after reconnects with nothing lost or doubled; and tools for the Vercel AI SDK.
 */
export { connect, Client, type ConnectOptions, type CallOptions, type ApproveOptions, type CallSpec } from "./client.js";
export { CallHandle, TurnHandle, type CallEvent } from "./handles.js";
export {
  ToolwireClientError,
  ConnectError,
  ConnectionLost,
  Detached,
  MessageTooBig,
  RequestError,
} from "./errors.js";
export { TOOL_CALL_NAMESPACE, toolCallId, toolCallIds } from "./ids.js";
export { renderResult } from "./rendering.js";
export { toolwireTools, type ToolwireToolOutput, type ToolwireToolsOptions } from "./aisdk.js";
export { ClientState } from "./state.js";
export { OutputCursor } from "./cursor.js";
export type * as protocol from "./protocol.js";
export type {
  Accepted,
  Approval,
  ApprovalResolved,
  CancelResult,
  ChatClosed,
  Output,
  Result,
  Sandbox,
  Started,
  ToolDefinition,
  Welcome,
} from "./protocol.js";
