" Vim syntax file for planlang (*.plan).
" grammar/planlang.lark is the one source of truth; tests/editors checks the word lists below against
" it, and (where vim is installed) that this file marks exactly the words the parser reads as keywords.
" All keywords are soft: each is also a name (`attention.output.dense`, `for x in ...`), so a keyword is
" only highlighted where the grammar puts it: statement keywords at the start of a line or after `;`
" or `{`, the others after the words they follow, and never next to a `.` or before `=`, `:` or `[`.
" License: Apache-2.0 (SPDX-License-Identifier: Apache-2.0), as the rest of planlang.
if exists('b:current_syntax')
  finish
endif
let s:cpo_save = &cpo
set cpo&vim
" Every pattern starts with \%#=1, the backtracking regexp engine: with the look-behinds the soft
" keywords need it is several times faster than the NFA engine.

syn case match

" ------------------------------------------------------------------------- word lists
let s:statement_keywords = ['use', 'model', 'input', 'device', 'link', 'mesh', 'budget', 'optimizer',
      \ 'data', 'shard', 'pipeline', 'stage', 'checkpoint', 'template', 'apply', 'for']
" word -> what must stand before it (a vim pattern); '' is anywhere outside a dotted name
let s:contextual_keywords = {
      \ 'as': '\<use\s\+\S\+\s\+',
      \ 'of': '\%(\<mesh\s\+\h\w*\|\<shard\s\+\%(output\|input\)\)\s\+',
      \ 'output': '\<shard\s\+',
      \ 'input': '\<shard\s\+',
      \ 'x': '\<of\s\+\d\%(_\=\d\)*\s*',
      \ 'over': '',
      \ 'per': '',
      \ 'device': '\<per\s\+',
      \ 'schedule': '',
      \ 'microbatches': '',
      \ 'chunks': '',
      \ 'with': '',
      \ 'every': '',
      \ 'to': '',
      \ 'in': '\<for\s\+\h\w*\s\+',
      \ 'partial': '\]\s*',
      \ }
" words that must follow: `output`/`input` are activation targets only before `of`, `per` only
" before `device`
let s:keyword_followers = {'output': '\s\+of\>', 'input': '\s\+of\>', 'per': '\s\+device\>'}
let s:dtypes = ['f64', 'float64', 'f32', 'float32', 'fp32', 'tf32', 'f16', 'float16', 'fp16', 'bf16',
      \ 'bfloat16', 'fp8', 'i64', 'int64', 'i32', 'int32', 'i16', 'int16', 'i8', 'int8', 'u8', 'uint8',
      \ 'bool']
let s:schedules = ['gpipe', '1f1b', 'interleaved', 'looped_bfs', 'zero_bubble', 'zbv', 'dualpipev']
let s:optimizers = ['sgd', 'momentum', 'adam', 'adamw', 'adagrad', 'rmsprop', 'adafactor', 'lion']
let s:param_kinds = ['axis', 'int']
" memory, bandwidth, throughput and time units (planlang.plan.units)
let s:unit_pattern = '\%([KMGTP]i\=B/s\|[KMGTP]i\=B\|B/s\|B\|[KMGTP]b/s\|[KMGTP]bps\|[KMGTP]\=FLOP/s'
      \ . '\|[KMGTP]\=FLOPS\|[num]\=s\)'

function! s:Alt(words) abort
  return '\%(' . join(a:words, '\|') . '\)'
endfunction

" ------------------------------------------------------------------------- lexical
syn match planNumber /\%#=1\%(\w\|\.\)\@1<!\d\%(_\=\d\)*\%(\.\d\%(_\=\d\)*\)\=\%([eE][+-]\=\d\+\)\=/
" (delimited by quotes: the units contain `/`)
exe 'syn match planUnit "\%#=1\%(\d\s*\)\@8<=' . s:unit_pattern . '\%(\w\|/\)\@!"'
syn match planHole /\%#=1?/
syn match planReplicated /\%#=1\%([[(,]\s*\)\@40<=_\%(\s*[]),]\)\@=/
syn match planBoolean /\%#=1\%(\w\|\.\)\@1<!\%(true\|false\|none\)\>\%(\s*\.\)\@!/
syn match planIllegal /\%#=1[-+']/
syn match planEscape /\%#=1\\./ contained
syn region planString start=/"/ skip=/\\./ end=/"\|$/ oneline contains=planEscape
syn match planContinuation /\%#=1\\\s*$/
syn match planSuppression /\%#=1\%(#\s*\)\@20<=plan:\s*ignore\%(-file\)\=\[[A-Za-z0-9_, \t]*\]/ contained
syn match planComment /\%#=1#.*$/ contains=planSuppression,@Spell

" ------------------------------------------------------------------------- names by position
syn match planGlob /\%#=1\*\*\=/
exe 'syn match planDtype /\%#=1\%(:\s*\)\@20<=' . s:Alt(s:dtypes) . '\>/'
exe 'syn match planDtype /\%#=1\%(\<flops\s*\.\s*\)\@20<=' . s:Alt(s:dtypes) . '\>/'
exe 'syn match planSchedule /\%#=1\%(\<schedule\s\+\)\@40<=' . s:Alt(s:schedules) . '\>/'
exe 'syn match planOptimizer /\%#=1\%(^\s*optimizer\s\+\)\@120<=' . s:Alt(s:optimizers) . '\>/'
exe 'syn match planKind /\%#=1\%([(,]\s*\h\w*\s*:\s*\)\@80<=' . s:Alt(s:param_kinds) . '\>/'
syn match planDeclName /\%#=1\%(\%(^\|[;{]\)\s*\%(model\|device\|link\|mesh\|template\)\s\+\)\@160<=\h\w*/

" ------------------------------------------------------------------------- keywords
let s:not_a_name = '\%([.[]\|\s*[=:,]\)\@!'
for s:word in keys(s:contextual_keywords)
  let s:before = s:contextual_keywords[s:word]
  let s:after = get(s:keyword_followers, s:word, '')
  let s:group = s:word ==# 'as' ? 'planInclude' : 'planKeyword'
  exe 'syn match ' . s:group . ' /\%#=1\.\@1<!\%(' . s:before . '\)\@80<=\<' . s:word . '\>'
        \ . (empty(s:after) ? '' : '\%(' . s:after . '\)\@=') . s:not_a_name . '/'
endfor
exe 'syn match planStatement /\%#=1\%(\%(^\|[;{]\)\s*\)\@120<=\<' . s:Alt(s:statement_keywords) . '\>'
      \ . s:not_a_name . '/'
exe 'syn match planInclude /\%#=1\%(\%(^\|[;{]\)\s*\)\@120<=\<use\>' . s:not_a_name . '/'

" ------------------------------------------------------------------------- colours
hi def link planComment Comment
hi def link planSuppression PreProc
hi def link planString String
hi def link planEscape SpecialChar
hi def link planNumber Number
hi def link planUnit Type
hi def link planHole Special
hi def link planReplicated Constant
hi def link planBoolean Boolean
hi def link planIllegal Error
hi def link planContinuation Delimiter
hi def link planGlob Operator
hi def link planDtype Type
hi def link planKind Type
hi def link planSchedule Constant
hi def link planOptimizer Constant
hi def link planDeclName Identifier
hi def link planStatement Statement
hi def link planKeyword Keyword
hi def link planInclude Include

let b:current_syntax = 'plan'
let &cpo = s:cpo_save
unlet s:cpo_save
