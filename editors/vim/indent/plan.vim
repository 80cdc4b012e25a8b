" Vim indent file for planlang (*.plan): one shiftwidth per open { [ ( ; a line that starts with a
" closing bracket goes back one level. Brackets in strings and comments do not count.
" License: Apache-2.0 (SPDX-License-Identifier: Apache-2.0), as the rest of planlang.
if exists('b:did_indent')
  finish
endif
let b:did_indent = 1

setlocal indentexpr=GetPlanIndent(v:lnum)
setlocal indentkeys=0{,0},0),0],!^F,o,O
setlocal autoindent
let b:undo_indent = 'setlocal indentexpr< indentkeys< autoindent<'

if exists('*GetPlanIndent')
  finish
endif

" The code of a line without strings and the trailing comment.
function! s:Code(line) abort
  let code = substitute(a:line, '"\%([^"\\]\|\\.\)*"\=', '""', 'g')
  return substitute(code, '#.*$', '', '')
endfunction

function! s:Count(text, pattern) abort
  return len(split(a:text, a:pattern, 1)) - 1
endfunction

function! GetPlanIndent(lnum) abort
  let prev = prevnonblank(a:lnum - 1)
  if prev == 0
    return 0
  endif
  let ind = indent(prev)
  let code = s:Code(getline(prev))
  " closers at the start of the previous line were already taken off its own indent
  let leading = len(matchstr(code, '^\s*\zs[}\])]*'))
  let net = s:Count(code, '[{[(]') - s:Count(code, '[}\])]') + leading
  if net > 0
    let ind += shiftwidth()
  elseif net < 0
    let ind -= shiftwidth()
  endif
  if getline(a:lnum) =~# '^\s*[}\])]'
    let ind -= shiftwidth()
  endif
  return max([ind, 0])
endfunction
